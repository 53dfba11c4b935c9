//! Backend messages the router writes to clients itself: its own errors, synthesized
//! completions, and the startup sequence. Replies from Postgres are forwarded, not built here.

use super::frame::{begin_frame, end_frame, put_frame};

/// Transaction status in ReadyForQuery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxStatus {
    Idle,
    InTransaction,
    Failed,
}

impl TxStatus {
    pub fn byte(self) -> u8 {
        match self {
            TxStatus::Idle => b'I',
            TxStatus::InTransaction => b'T',
            TxStatus::Failed => b'E',
        }
    }

    pub fn from_byte(b: u8) -> Option<TxStatus> {
        match b {
            b'I' => Some(TxStatus::Idle),
            b'T' => Some(TxStatus::InTransaction),
            b'E' => Some(TxStatus::Failed),
            _ => None,
        }
    }
}

/// An error or notice as Postgres would send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// `ERROR`, `FATAL` or `NOTICE`.
    pub severity: &'static str,
    /// The SQLSTATE: one of the router's own (static), or one passed on from Postgres.
    pub code: std::borrow::Cow<'static, str>,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl SqlError {
    pub fn new(code: &'static str, message: impl Into<String>) -> SqlError {
        SqlError {
            severity: "ERROR",
            code: std::borrow::Cow::Borrowed(code),
            message: message.into(),
            detail: None,
            hint: None,
        }
    }

    pub fn fatal(code: &'static str, message: impl Into<String>) -> SqlError {
        SqlError {
            severity: "FATAL",
            ..SqlError::new(code, message)
        }
    }

    /// A notice (NoticeResponse), for what the client should read but is not an error.
    pub fn notice(message: impl Into<String>) -> SqlError {
        SqlError {
            severity: "NOTICE",
            ..SqlError::new("00000", message)
        }
    }

    /// An error with a SQLSTATE that came from Postgres.
    pub fn with_code(code: String, message: impl Into<String>) -> SqlError {
        SqlError {
            code: std::borrow::Cow::Owned(code),
            ..SqlError::new("XX000", message)
        }
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> SqlError {
        self.hint = Some(hint.into());
        self
    }

    pub fn with_detail(mut self, detail: impl Into<String>) -> SqlError {
        self.detail = Some(detail.into());
        self
    }

    /// Appends this error as an ErrorResponse (a notice as a NoticeResponse).
    pub fn write(&self, out: &mut Vec<u8>) {
        let tag = if self.severity == "NOTICE" {
            b'N'
        } else {
            b'E'
        };
        let at = begin_frame(out, tag);
        let mut field = |tag: u8, value: &str| {
            out.push(tag);
            // A NUL inside would end the field early; Postgres never sends one either.
            out.extend(value.bytes().filter(|&b| b != 0));
            out.push(0);
        };
        field(b'S', self.severity);
        field(b'V', self.severity);
        field(b'C', &self.code);
        field(b'M', &self.message);
        if let Some(d) = &self.detail {
            field(b'D', d);
        }
        if let Some(h) = &self.hint {
            field(b'H', h);
        }
        out.push(0);
        end_frame(out, at);
    }
}

impl std::fmt::Display for SqlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code)
    }
}

pub fn ready_for_query(out: &mut Vec<u8>, status: TxStatus) {
    put_frame(out, b'Z', &[status.byte()]);
}

pub fn command_complete(out: &mut Vec<u8>, tag: &str) {
    let at = begin_frame(out, b'C');
    out.extend_from_slice(tag.as_bytes());
    out.push(0);
    end_frame(out, at);
}

/// A RowDescription of text columns named `names` (for answers the router makes up).
pub fn text_row_description(out: &mut Vec<u8>, names: &[&str]) {
    const TEXT: u32 = 25;
    let at = begin_frame(out, b'T');
    out.extend_from_slice(&(names.len() as i16).to_be_bytes());
    for name in names {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(&0u32.to_be_bytes()); // no table
        out.extend_from_slice(&0i16.to_be_bytes()); // no column number
        out.extend_from_slice(&TEXT.to_be_bytes());
        out.extend_from_slice(&(-1i16).to_be_bytes()); // variable width
        out.extend_from_slice(&(-1i32).to_be_bytes()); // no type modifier
        out.extend_from_slice(&0i16.to_be_bytes()); // text format
    }
    end_frame(out, at);
}

/// A DataRow of text values (`None` is NULL).
pub fn text_data_row(out: &mut Vec<u8>, values: &[Option<&str>]) {
    let at = begin_frame(out, b'D');
    out.extend_from_slice(&(values.len() as i16).to_be_bytes());
    for v in values {
        match v {
            Some(v) => {
                out.extend_from_slice(&(v.len() as i32).to_be_bytes());
                out.extend_from_slice(v.as_bytes());
            }
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
        }
    }
    end_frame(out, at);
}

pub fn parse_complete(out: &mut Vec<u8>) {
    put_frame(out, b'1', &[]);
}

pub fn bind_complete(out: &mut Vec<u8>) {
    put_frame(out, b'2', &[]);
}

pub fn close_complete(out: &mut Vec<u8>) {
    put_frame(out, b'3', &[]);
}

/// The answer to Describe of a statement without rows or parameters (DDL, BEGIN): `t` with no
/// parameters and `n` for a statement, `n` for a portal.
pub fn no_data_description(out: &mut Vec<u8>, kind: u8) {
    if kind == b'S' {
        put_frame(out, b't', &0i16.to_be_bytes());
    }
    put_frame(out, b'n', &[]);
}

/// `t` ParameterDescription of these parameter type OIDs (each 4 bytes, as sent).
pub fn parameter_description<'a>(out: &mut Vec<u8>, oids: impl ExactSizeIterator<Item = &'a [u8]>) {
    let mut body = Vec::with_capacity(2 + 4 * oids.len());
    body.extend_from_slice(&(oids.len() as i16).to_be_bytes());
    for oid in oids {
        body.extend_from_slice(oid);
    }
    put_frame(out, b't', &body);
}

pub fn empty_query(out: &mut Vec<u8>) {
    put_frame(out, b'I', &[]);
}

pub fn auth_ok(out: &mut Vec<u8>) {
    put_frame(out, b'R', &0i32.to_be_bytes());
}

/// AuthenticationSASL (10), SASLContinue (11) or SASLFinal (12) with `data`.
pub fn auth_sasl(out: &mut Vec<u8>, kind: i32, data: &[u8]) {
    let at = begin_frame(out, b'R');
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(data);
    end_frame(out, at);
}

/// AuthenticationCleartextPassword is never used: passwords only travel as SCRAM proofs.
pub fn parameter_status(out: &mut Vec<u8>, name: &str, value: &str) {
    let at = begin_frame(out, b'S');
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    out.extend_from_slice(value.as_bytes());
    out.push(0);
    end_frame(out, at);
}

pub fn backend_key_data(out: &mut Vec<u8>, pid: i32, secret: i32) {
    let at = begin_frame(out, b'K');
    out.extend_from_slice(&pid.to_be_bytes());
    out.extend_from_slice(&secret.to_be_bytes());
    end_frame(out, at);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::frame::next_frame;

    #[test]
    fn error_response_has_the_fields_clients_read() {
        let mut out = Vec::new();
        SqlError::new("0A000", "cannot route")
            .with_hint("add a key")
            .write(&mut out);
        let h = next_frame(&out).unwrap().unwrap();
        assert_eq!((h.tag, h.total), (b'E', out.len()));
        let body = &out[h.body()];
        let fields: Vec<&[u8]> = body.split(|&b| b == 0).filter(|f| !f.is_empty()).collect();
        assert_eq!(
            fields,
            [
                &b"SERROR"[..],
                b"VERROR",
                b"C0A000",
                b"Mcannot route",
                b"Hadd a key"
            ]
        );
    }
}

/// An ErrorResponse frame without the fields that say where in the server it arose (context,
/// source file, line, routine, position): the router's own errors are raised on a backend with
/// a `DO` block (so the backend's transaction fails with them), and its PL/pgSQL context is
/// not part of the error the client would get from Postgres.
pub fn without_server_location(frame: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(frame.len());
    let at = crate::protocol::frame::begin_frame(&mut out, frame[0]);
    for field in frame.get(5..).unwrap_or_default().split(|&b| b == 0) {
        match field.first() {
            None | Some(b'W' | b'F' | b'L' | b'R' | b'P' | b'p' | b'q') => {}
            Some(_) => {
                out.extend_from_slice(field);
                out.push(0);
            }
        }
    }
    out.push(0);
    crate::protocol::frame::end_frame(&mut out, at);
    out
}

#[cfg(test)]
mod location_tests {
    use super::*;

    #[test]
    fn drops_where_the_server_raised_it() {
        let mut frame = Vec::new();
        crate::protocol::frame::put_frame(
            &mut frame,
            b'E',
            b"SERROR\0C0A000\0Mno\0Hhint\0WPL/pgSQL function inline_code_block line 1 at RAISE\0Fpl_exec.c\0L3900\0Rexec_stmt_raise\0\0",
        );
        let mut want = Vec::new();
        crate::protocol::frame::put_frame(&mut want, b'E', b"SERROR\0C0A000\0Mno\0Hhint\0\0");
        assert_eq!(without_server_location(&frame), want);
    }
}
