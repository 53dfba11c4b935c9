//! The slowloris phase of `loadgen storm`: silent sockets held and reopened whenever the server
//! closes them (what the server said when it did, how long each was held), and a bystander that
//! logs in on a fresh connection every few hundred milliseconds meanwhile.

use super::*;

/// One silent socket's figures.
struct Silent {
    held: Histogram<u64>,
    renewals: u64,
    closes: Tallies,
    connect_failures: Tallies,
    open_at_end: bool,
}

/// Opens a TCP connection from `from` (any address when None), within `timeout`.
async fn open_silent(
    addr: SocketAddr,
    from: Option<IpAddr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(ip) = from {
        socket.bind(SocketAddr::new(ip, 0))?;
    }
    match tokio::time::timeout(timeout, socket.connect(addr)).await {
        Ok(r) => r,
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no connection within {:.1} s", timeout.as_secs_f64()),
        )),
    }
}

/// Reads what the server sends until it closes the connection; returns how it closed it
/// (a key and a message).
async fn until_closed(stream: &mut TcpStream) -> (String, String) {
    let mut first = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return describe_close(&first, None),
            Ok(k) => {
                if first.len() < 4096 {
                    first.extend_from_slice(&buf[..k]);
                }
            }
            Err(e) => return describe_close(&first, Some(&e)),
        }
    }
}

/// How a server closed a silent connection: what it said first (an ErrorResponse's SQLSTATE
/// and message) and how the connection ended.
pub fn describe_close(said: &[u8], error: Option<&io::Error>) -> (String, String) {
    let end = match error {
        None => "closed".to_string(),
        Some(e) => format!("{}", e.kind()),
    };
    if said.is_empty() {
        let message = error.map_or("closed without a word".to_string(), |e| e.to_string());
        return (end, message);
    }
    if let Some(e) = error_response(said) {
        return (
            format!("ErrorResponse {}, then {end}", e.code),
            format!("{} {}: {}", e.severity, e.code, e.message),
        );
    }
    (
        format!("other bytes, then {end}"),
        format!("{} bytes, first 0x{:02x}", said.len(), said[0]),
    )
}

/// What a server said in an ErrorResponse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    pub code: String,
    pub message: String,
}

/// The severity, SQLSTATE and message of a Postgres ErrorResponse (`E`, length, fields).
pub fn error_response(msg: &[u8]) -> Option<ServerError> {
    if msg.first() != Some(&b'E') || msg.len() < 5 {
        return None;
    }
    let len = u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize;
    let body = msg.get(5..(1 + len).min(msg.len()))?;
    let (mut severity, mut code, mut message) = (None, None, None);
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0)?;
        let value = String::from_utf8_lossy(&tail[..end]).into_owned();
        match kind {
            b'S' => severity = Some(value),
            b'C' => code = Some(value),
            b'M' => message = Some(value),
            _ => {}
        }
        rest = &tail[end + 1..];
    }
    Some(ServerError {
        severity: severity.unwrap_or_else(|| "ERROR".to_string()),
        code: code?,
        message: message.unwrap_or_default(),
    })
}

/// One silent socket: open, wait for the server to close it, reopen at once, until `stop`.
async fn silent_socket(
    addr: SocketAddr,
    from: Option<IpAddr>,
    timeout: Duration,
    connected: Arc<AtomicUsize>,
    open: Arc<AtomicUsize>,
    renewals: Arc<AtomicU64>,
    mut stop: watch::Receiver<bool>,
) -> Silent {
    let mut me = Silent {
        held: crate::stats::new_hist(),
        renewals: 0,
        closes: Tallies::new(),
        connect_failures: Tallies::new(),
        open_at_end: false,
    };
    let mut ever_connected = false;
    loop {
        let opened = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            r = open_silent(addr, from, timeout) => r,
        };
        let mut stream = match opened {
            Ok(s) => s,
            Err(e) => {
                add(
                    &mut me.connect_failures,
                    &e.kind().to_string(),
                    &e.to_string(),
                );
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(SILENT_RETRY_PAUSE) => continue,
                }
            }
        };
        if !ever_connected {
            ever_connected = true;
            connected.fetch_add(1, Ordering::Relaxed);
        }
        open.fetch_add(1, Ordering::Relaxed);
        let since = Instant::now();
        let closed = tokio::select! {
            _ = stop.wait_for(|s| *s) => None,
            c = until_closed(&mut stream) => Some(c),
        };
        match closed {
            None => {
                me.open_at_end = true;
                break;
            }
            Some((key, message)) => {
                open.fetch_sub(1, Ordering::Relaxed);
                record(&mut me.held, since.elapsed());
                me.renewals += 1;
                renewals.fetch_add(1, Ordering::Relaxed);
                add(&mut me.closes, &key, &message);
            }
        }
    }
    me
}

/// The bystander: a fresh login and `SELECT 1` every `every` for `duration` (each attempt on
/// its own, so a slow one does not delay the next); waits for the last attempt.
async fn bystander(
    every: Duration,
    duration: Duration,
    dialer: &Dialer,
    timeout: Duration,
    attempts: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
) -> Result<BystanderPhase, crate::Error> {
    let end = Instant::now() + duration;
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut tasks = Vec::new();
    loop {
        tick.tick().await;
        if Instant::now() >= end {
            break;
        }
        attempts.fetch_add(1, Ordering::Relaxed);
        let (dialer, failures) = (dialer.clone(), failures.clone());
        tasks.push(tokio::spawn(async move {
            let began = Instant::now();
            let result = match dialer.login(timeout).await {
                Ok(client) => {
                    let took = began.elapsed();
                    select_one(&client, timeout).await.map(|()| took)
                }
                Err(f) => Err(f),
            };
            if result.is_err() {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            result
        }));
    }
    let mut phase = BystanderPhase {
        every_ms: every.as_secs_f64() * 1000.0,
        attempts: 0,
        ok: 0,
        failures: Tallies::new(),
        login_latency: None,
    };
    let mut hist = crate::stats::new_hist();
    for t in tasks {
        phase.attempts += 1;
        match t
            .await
            .map_err(|e| format!("a bystander login failed: {e}"))?
        {
            Ok(took) => {
                phase.ok += 1;
                record(&mut hist, took);
            }
            Err(f) => add(&mut phase.failures, &f.key, &f.message),
        }
    }
    phase.login_latency = latency(&hist);
    Ok(phase)
}

/// The slowloris and its bystander.
pub(super) async fn slowloris_phase(
    cfg: &StormConfig,
    dialer: &Dialer,
    addr: Option<SocketAddr>,
) -> Result<SlowlorisPhase, crate::Error> {
    let m = cfg.silent;
    let addr = if m > 0 { addr } else { None };
    if let (Some(addr), Some(from)) = (addr, cfg.silent_from) {
        if addr.is_ipv4() != from.is_ipv4() {
            return Err(format!(
                "--silent-from {from} and the target {addr} are not the same IP version"
            ));
        }
    }
    let server_before = cfg.server_pid.map(server_ticks).transpose()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let connected = Arc::new(AtomicUsize::new(0));
    let open = Arc::new(AtomicUsize::new(0));
    let renewals = Arc::new(AtomicU64::new(0));
    let attempts = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut silent = Vec::with_capacity(m);
    if let Some(addr) = addr {
        if !cfg.quiet {
            eprintln!(
                "loadgen storm: opening {m} silent connections to {addr}{} ...",
                cfg.silent_from
                    .map_or(String::new(), |f| format!(" from {f}"))
            );
        }
        for _ in 0..m {
            silent.push(tokio::spawn(silent_socket(
                addr,
                cfg.silent_from,
                cfg.timeout,
                connected.clone(),
                open.clone(),
                renewals.clone(),
                stop_rx.clone(),
            )));
        }
    }
    let wait_until = started + SILENT_CONNECT_WAIT;
    while connected.load(Ordering::Relaxed) < m && Instant::now() < wait_until {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let connected_at_start = connected.load(Ordering::Relaxed);
    let seconds_to_connect = started.elapsed().as_secs_f64();
    let progress = {
        let (open, renewals, attempts, failures) = (
            open.clone(),
            renewals.clone(),
            attempts.clone(),
            failures.clone(),
        );
        let by = cfg.bystander_every.is_some();
        ticker(cfg.quiet, move || {
            let mut line = format!(
                "silent open {}/{m}  closed by server {}",
                open.load(Ordering::Relaxed),
                renewals.load(Ordering::Relaxed)
            );
            if by {
                line += &format!(
                    "  | bystander attempts {}  failed {}",
                    attempts.load(Ordering::Relaxed),
                    failures.load(Ordering::Relaxed)
                );
            }
            line
        })
    };
    let by = match cfg.bystander_every {
        Some(every) => {
            if !cfg.quiet {
                eprintln!(
                    "loadgen storm: {connected_at_start} of {m} silent connections open; a bystander logs in every {} ms for {:.1} s ...",
                    every.as_millis(),
                    cfg.duration.as_secs_f64()
                );
            }
            Some(
                bystander(
                    every,
                    cfg.duration,
                    dialer,
                    cfg.timeout,
                    attempts.clone(),
                    failures.clone(),
                )
                .await?,
            )
        }
        None => {
            tokio::time::sleep(cfg.duration).await;
            None
        }
    };
    // Measured while the silent sockets are still held.
    let server = match (cfg.server_pid, server_before) {
        (Some(pid), Some(before)) => Some(server_use(pid, before, None)?),
        _ => None,
    };
    if let Some(p) = progress {
        p.abort();
    }
    let _ = stop_tx.send(true);
    let mut phase = SlowlorisPhase {
        silent: m,
        silent_from: cfg.silent_from.map(|ip| ip.to_string()),
        duration_s: cfg.duration.as_secs_f64(),
        connected_at_start,
        seconds_to_connect,
        renewals: 0,
        closes: Tallies::new(),
        held: None,
        connect_failures: Tallies::new(),
        open_at_end: 0,
        bystander: by,
        server,
    };
    let mut held = crate::stats::new_hist();
    for t in silent {
        let s = t
            .await
            .map_err(|e| format!("a silent connection failed: {e}"))?;
        held.add(&s.held)
            .map_err(|e| format!("cannot add histograms: {e:?}"))?;
        phase.renewals += s.renewals;
        phase.open_at_end += usize::from(s.open_at_end);
        for (into, from) in [
            (&mut phase.closes, s.closes),
            (&mut phase.connect_failures, s.connect_failures),
        ] {
            for (key, t) in from {
                into.entry(key)
                    .and_modify(|x| x.count += t.count)
                    .or_insert(t);
            }
        }
    }
    phase.held = latency(&held);
    Ok(phase)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a listener that closes every connection at once and one that never answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn silent_sockets_are_renewed_and_logins_time_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                drop(s);
            }
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let (connected, open, renewals) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicU64::new(0)),
        );
        let task = tokio::spawn(silent_socket(
            addr,
            Some("127.0.0.1".parse().expect("ip")),
            Duration::from_secs(5),
            connected.clone(),
            open,
            renewals.clone(),
            stop_rx,
        ));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let _ = stop_tx.send(true);
        let s = task.await.expect("silent task");
        assert_eq!(connected.load(Ordering::Relaxed), 1);
        assert!(s.renewals >= 2, "renewed {} times", s.renewals);
        assert!(s.closes.contains_key("closed") || s.closes.contains_key("connection reset"));

        // A server that accepts and says nothing: the login times out.
        let mute = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("listen");
        let port = mute.local_addr().expect("addr").port();
        let keep = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = mute.accept().await {
                held.push(s);
            }
        });
        let dialer = Dialer {
            config: Arc::new(
                parse_target(&format!("postgres://u:p@127.0.0.1:{port}/d"), false).expect("url"),
            ),
            tls: None,
        };
        let Err(err) = dialer.login(Duration::from_millis(200)).await else {
            panic!("a login to a server that never answers succeeded");
        };
        assert_eq!(err.key, "timeout");
        assert!(!err.refused);
        keep.abort();
    }
}
