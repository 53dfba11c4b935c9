//! The proxy against real sockets on 127.0.0.1: only lower bounds on time are asserted.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use super::*;
use std::sync::atomic::AtomicUsize;

/// An echo server on an ephemeral port, and how many connections it has accepted.
fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind echo");
    let addr = listener.local_addr().expect("echo addr");
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&accepted);
    thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            count.fetch_add(1, Ordering::SeqCst);
            thread::spawn(move || {
                let Ok(mut back) = stream.try_clone() else {
                    return;
                };
                let _ = io::copy(&mut stream, &mut back);
            });
        }
    });
    (addr, accepted)
}

fn proxy_to(target: SocketAddr, delay_us: u64) -> (Started, SocketAddr) {
    let args = ProxyArgs {
        routes: vec![format!("127.0.0.1:0={target}")],
        control: "127.0.0.1:0".to_string(),
        delay_us,
    };
    let started = start(&args).expect("proxy starts");
    let listen = started.routes[0].listen;
    (started, listen)
}

/// A control connection: send a command, read its reply lines up to `ok` or `error:`.
struct Control {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl Control {
    fn open(addr: SocketAddr) -> Control {
        let out = TcpStream::connect(addr).expect("control connect");
        let input = BufReader::new(out.try_clone().expect("clone"));
        Control { out, input }
    }

    fn send(&mut self, command: &str) -> Vec<String> {
        writeln!(self.out, "{command}").expect("send command");
        let mut lines = Vec::new();
        loop {
            let mut line = String::new();
            let n = self.input.read_line(&mut line).expect("reply");
            assert!(n > 0, "control closed after {lines:?}");
            let line = line.trim_end().to_string();
            let last = line == "ok" || line.starts_with("error: ");
            lines.push(line);
            if last {
                return lines;
            }
        }
    }

    fn ok(&mut self, command: &str) {
        assert_eq!(self.send(command), ["ok"], "{command}");
    }

    fn status(&mut self) -> String {
        let lines = self.send("status");
        assert_eq!(lines.len(), 2, "{lines:?}");
        lines[0].clone()
    }
}

fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn round_trip(stream: &mut TcpStream, msg: &[u8]) {
    stream.write_all(msg).expect("write");
    let mut back = vec![0u8; msg.len()];
    stream.read_exact(&mut back).expect("read echo");
    assert_eq!(back, msg);
}

fn connect_client(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect to proxy");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s
}

/// Whether the peer closed `s`: a read returns 0 or fails, but does not time out.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
    }
}

#[test]
fn pass_mode_carries_bytes_both_ways_unchanged() {
    let (echo, _) = echo_server();
    let (proxy, listen) = proxy_to(echo, 0);
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut client = connect_client(listen);
    let mut sender = client.try_clone().expect("clone");
    let sent = payload.clone();
    let writer = thread::spawn(move || sender.write_all(&sent).expect("write"));
    let mut back = vec![0u8; payload.len()];
    client.read_exact(&mut back).expect("read all back");
    writer.join().expect("writer");
    assert!(back == payload, "bytes changed on the way");
    let mut control = Control::open(proxy.control);
    assert!(control.status().contains("connections=1"));
    drop(client);
    let want = format!(
        "mode=pass delay_us=0 connections=0 bytes_up={n} bytes_down={n}",
        n = payload.len()
    );
    eventually("the closed connection is gone", || {
        control.status().ends_with(&want)
    });
    assert!(control.status().starts_with(&format!("{listen} {echo} ")));
}

#[test]
fn a_round_trip_pays_the_delay_each_way() {
    let (echo, _) = echo_server();
    let (proxy, listen) = proxy_to(echo, 20_000);
    let mut client = connect_client(listen);
    let t = Instant::now();
    round_trip(&mut client, b"ping");
    assert!(
        t.elapsed() >= Duration::from_millis(40),
        "{:?}",
        t.elapsed()
    );
    // Sub-millisecond delays hold too.
    Control::open(proxy.control).ok(&format!("delay {} 500", listen.port()));
    for _ in 0..20 {
        let t = Instant::now();
        round_trip(&mut client, b"pong");
        assert!(
            t.elapsed() >= Duration::from_micros(1000),
            "{:?}",
            t.elapsed()
        );
    }
}

#[test]
fn pipelined_messages_each_pay_the_delay_in_order() {
    let (echo, _) = echo_server();
    let (_proxy, listen) = proxy_to(echo, 30_000);
    let mut client = connect_client(listen);
    let mut sender = client.try_clone().expect("clone");
    let writer = thread::spawn(move || {
        let mut sent = Vec::new();
        for i in 0..5u8 {
            sent.push(Instant::now());
            sender
                .write_all(&[b'm', b'0' + i, 0, 1, 2, 3, 4, i])
                .expect("write");
            thread::sleep(Duration::from_millis(5));
        }
        sent
    });
    let mut arrived = Vec::new();
    for i in 0..5u8 {
        let mut msg = [0u8; 8];
        client.read_exact(&mut msg).expect("echo");
        arrived.push(Instant::now());
        assert_eq!(msg, [b'm', b'0' + i, 0, 1, 2, 3, 4, i]);
    }
    let sent = writer.join().expect("writer");
    for (i, (s, a)) in sent.iter().zip(&arrived).enumerate() {
        let took = a.duration_since(*s);
        assert!(took >= Duration::from_millis(60), "message {i}: {took:?}");
    }
}

#[test]
fn cut_closes_open_and_new_connections_until_healed() {
    let (echo, _) = echo_server();
    let (proxy, listen) = proxy_to(echo, 0);
    let mut control = Control::open(proxy.control);
    let mut open = connect_client(listen);
    round_trip(&mut open, b"hello");
    control.ok(&format!("cut {}", listen.port()));
    assert!(
        closed_by_peer(&mut open),
        "the open connection survived a cut"
    );
    let mut new = connect_client(listen);
    assert!(closed_by_peer(&mut new), "a new connection survived a cut");
    eventually("the cut connections are gone", || {
        control
            .status()
            .contains("mode=cut delay_us=0 connections=0")
    });
    control.ok("heal all");
    let mut healed = connect_client(listen);
    round_trip(&mut healed, b"again");
    assert!(control.status().contains("mode=pass"));
}

/// A connection whose bytes wait out a long delay ends soon after a cut, not when the delay
/// is over (here an hour).
#[test]
fn a_cut_ends_a_connection_asleep_on_a_long_delay() {
    let (echo, _) = echo_server();
    let (proxy, listen) = proxy_to(echo, 3_600_000_000);
    let mut control = Control::open(proxy.control);
    let mut open = connect_client(listen);
    open.write_all(b"waits an hour").expect("write");
    eventually("the connection is counted", || {
        control.status().contains("connections=1")
    });
    control.ok(&format!("cut {}", listen.port()));
    eventually("the cut connection is gone", || {
        control
            .status()
            .contains("mode=cut delay_us=3600000000 connections=0")
    });
}

#[test]
fn blackhole_holds_data_and_heal_delivers_it_in_order() {
    let (echo, accepted) = echo_server();
    let (proxy, listen) = proxy_to(echo, 0);
    let mut control = Control::open(proxy.control);
    let mut open = connect_client(listen);
    round_trip(&mut open, b"before");
    control.ok(&format!("blackhole {}", listen.port()));
    open.write_all(b"abc").expect("write");
    open.write_all(b"def").expect("write");
    let mut new = connect_client(listen);
    new.write_all(b"xyz").expect("write");
    open.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut buf = [0u8; 16];
    match open.read(&mut buf) {
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) => {}
        other => panic!("a blackhole let something through: {other:?}"),
    }
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "connected through a blackhole"
    );
    // The second connection is counted once the proxy's accept thread has taken it.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut status = control.status();
    while !status.contains("mode=blackhole delay_us=0 connections=2") && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
        status = control.status();
    }
    assert!(
        status.contains("mode=blackhole delay_us=0 connections=2"),
        "{status}"
    );
    control.ok("heal all");
    open.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut held = [0u8; 6];
    open.read_exact(&mut held).expect("held bytes");
    assert_eq!(&held, b"abcdef");
    let mut held = [0u8; 3];
    new.read_exact(&mut held)
        .expect("held bytes of the new connection");
    assert_eq!(&held, b"xyz");
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[test]
fn control_answers_each_command_and_explains_errors() {
    let (echo, _) = echo_server();
    let (proxy, listen) = proxy_to(echo, 0);
    let port = listen.port();
    let mut control = Control::open(proxy.control);
    let unknown = if port == 1 { 2 } else { 1 };
    for bad in [
        format!("cut {unknown}"),
        "heal nowhere".to_string(),
        format!("delay {port} abc"),
        format!("delay {port} -5"),
        format!("delay {port} 99999999999999"),
        "delay all".to_string(),
        "frobnicate 1".to_string(),
        "cut".to_string(),
    ] {
        let reply = control.send(&bad);
        assert_eq!(reply.len(), 1, "{bad}: {reply:?}");
        assert!(
            reply[0].starts_with("error: ") && reply[0].len() > 20,
            "{bad}: {reply:?}"
        );
    }
    assert!(control.send(&format!("cut {unknown}"))[0].contains(&port.to_string()));
    assert!(control.send(&format!("delay {port} abc"))[0].contains("\"abc\""));
    control.ok("delay all 250");
    control.ok(&format!("blackhole {port}"));
    let status = control.send(&format!("status {port}"));
    assert_eq!(status.len(), 2, "{status:?}");
    assert!(status[0].contains("mode=blackhole delay_us=250 connections=0"));
    control.ok(&format!("heal {port}"));
    assert!(control.status().contains("mode=pass delay_us=250"));
}

#[test]
fn bad_arguments_are_named() {
    let start_with = |routes: Vec<String>, control: &str, delay_us| {
        let args = ProxyArgs {
            routes,
            control: control.to_string(),
            delay_us,
        };
        start(&args).err().expect("should fail")
    };
    let fine = || vec!["127.0.0.1:0=127.0.0.1:1".to_string()];
    let e = start_with(vec!["nonsense".into()], "127.0.0.1:0", 0);
    assert!(e.contains("--route \"nonsense\""), "{e}");
    let e = start_with(vec!["127.0.0.1:0=".into()], "127.0.0.1:0", 0);
    assert!(e.contains("LISTEN=TARGET"), "{e}");
    let e = start_with(vec!["127.0.0.1:0=nowhere".into()], "127.0.0.1:0", 0);
    assert!(e.contains("cannot resolve the target"), "{e}");
    let e = start_with(vec!["8400=127.0.0.1:1".into()], "127.0.0.1:0", 0);
    assert!(e.contains("cannot listen on \"8400\""), "{e}");
    let e = start_with(fine(), "control", 0);
    assert!(e.contains("--control control"), "{e}");
    let e = start_with(fine(), "127.0.0.1:0", MAX_DELAY_US + 1);
    assert!(e.contains("--delay-us"), "{e}");
    let free = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = free.local_addr().expect("addr").port();
    drop(free);
    let twice = vec![
        format!("127.0.0.1:{port}=127.0.0.1:1"),
        format!("127.0.0.2:{port}=127.0.0.1:1"),
    ];
    let e = start_with(twice, "127.0.0.1:0", 0);
    assert!(e.contains(&format!("port {port}")), "{e}");
}
