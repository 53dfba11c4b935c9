//! The few things the router reads inside a backend's reply frames: an ErrorResponse's
//! SQLSTATE and message, the row count of a CommandComplete, a ReadyForQuery's status. Rows
//! and everything else pass through undecoded.

use super::reply::TxStatus;

/// SQLSTATE and message of an ErrorResponse (or NoticeResponse) frame.
pub fn error_fields(frame: &[u8]) -> (String, String) {
    let mut code = String::new();
    let mut message = String::new();
    for field in frame.get(5..).unwrap_or_default().split(|&b| b == 0) {
        match field.split_first() {
            Some((b'C', v)) => code = String::from_utf8_lossy(v).into_owned(),
            Some((b'M', v)) => message = String::from_utf8_lossy(v).into_owned(),
            _ => {}
        }
    }
    (code, message)
}

/// Whether a reply frame only describes (ParseComplete, BindComplete, ParameterDescription,
/// RowDescription, NoData): nothing of a request has run or been seen to run while its replies
/// The first ErrorResponse among a shard's answer frames.
pub fn error_frame(answer: &[u8]) -> Option<&[u8]> {
    super::frame::frames(answer)
        .map_while(Result::ok)
        .find(|f| f[0] == b'E')
}

/// are only these, so a request a shutdown aborts after them may still be sent again.
pub fn is_description(tag: u8) -> bool {
    matches!(tag, b'1' | b'2' | b't' | b'T' | b'n')
}

/// Whether an ErrorResponse frame is Postgres ending the session at a shutdown or restart
/// (FATAL 57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now).
pub fn is_shutdown(frame: &[u8]) -> bool {
    let mut fatal = false;
    let mut code = false;
    for field in frame.get(5..).unwrap_or_default().split(|&b| b == 0) {
        match field {
            [b'V', v @ ..] | [b'S', v @ ..] => fatal |= v == b"FATAL" || v == b"PANIC",
            [b'C', b'5', b'7', b'P', b'0', b'1' | b'2' | b'3'] => code = true,
            _ => {}
        }
    }
    fatal && code
}

/// The class (first two characters) of the SQLSTATE in an ErrorResponse body, without
/// allocating: what the router's error counters are kept by.
pub fn sqlstate_class(body: &[u8]) -> Option<[u8; 2]> {
    body.split(|&b| b == 0).find_map(|field| match field {
        [b'C', a, b, ..] => Some([*a, *b]),
        _ => None,
    })
}

/// The number in a CommandComplete body such as `SELECT 42` or `INSERT 0 3` (0 when none).
pub fn rows_in_tag(body: &[u8]) -> u64 {
    let text = body.strip_suffix(b"\0").unwrap_or(body);
    text.rsplit(|&b| b == b' ')
        .next()
        .and_then(|n| std::str::from_utf8(n).ok())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A CommandComplete body without its row count: `SELECT`, `UPDATE`, `INSERT 0`, ...
pub fn command_of_tag(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body.strip_suffix(b"\0").unwrap_or(body)).into_owned();
    match text.rsplit_once(' ') {
        Some((word, _)) => word.to_string(),
        None => text,
    }
}

/// The status of a ReadyForQuery frame.
pub fn ready_status(frame: &[u8]) -> Option<TxStatus> {
    frame.get(5).copied().and_then(TxStatus::from_byte)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tags_and_errors() {
        assert_eq!(rows_in_tag(b"SELECT 42\0"), 42);
        assert_eq!(rows_in_tag(b"INSERT 0 3\0"), 3);
        assert_eq!(rows_in_tag(b"SELECT\0"), 0);
        assert_eq!(command_of_tag(b"UPDATE 7\0"), "UPDATE");
        assert_eq!(command_of_tag(b"INSERT 0 7\0"), "INSERT 0");
        let mut frame = Vec::new();
        super::super::frame::put_frame(&mut frame, b'E', b"SERROR\0C42P07\0Mexists\0\0");
        assert_eq!(
            error_fields(&frame),
            ("42P07".to_string(), "exists".to_string())
        );
        assert_eq!(sqlstate_class(&frame[5..]), Some(*b"42"));
        assert_eq!(sqlstate_class(b"SERROR\0Mno code\0\0"), None);
        assert_eq!(ready_status(b"Z\0\0\0\x05T"), Some(TxStatus::InTransaction));
    }
}
