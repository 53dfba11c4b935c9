//! `relay`: the floor of any proxy's cost per statement, for the io_uring experiment of issue 26.
//!
//! A byte relay between clients and one Postgres, on one thread, that parses nothing: what is
//! left of a proxy when routing, pooling and bookkeeping are taken away. It comes in two forms
//! that differ only in how they wait for the sockets:
//!
//! - `--mode epoll`: tokio's current-thread runtime (readiness through epoll, then `recv` and
//!   `send` one system call each), the runtime every router worker runs on;
//! - `--mode uring`: io_uring completions, where one `io_uring_enter` submits every send and
//!   receive that is due and reaps every one that finished.
//!
//! `benches/compare.sh -t relay-epoll,relay-uring,...` runs both beside the router and
//! PgBouncer, so the CPU a statement costs each form shows what a completion-based router could
//! save at most: the kernel's TCP work is the same in both, and a router adds its own on top.

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

use clap::{Parser, ValueEnum};
use io_uring::{opcode, squeue, types, IoUring};

/// A byte relay from clients to one Postgres, on one thread (see benches/relay/main.rs).
#[derive(Parser)]
#[command(version)]
struct Args {
    /// How the relay waits for its sockets.
    #[arg(long, value_enum)]
    mode: Mode,
    /// The address clients connect to.
    #[arg(long)]
    listen: SocketAddr,
    /// The Postgres each client's connection is relayed to.
    #[arg(long)]
    upstream: SocketAddr,
}

#[derive(Clone, Copy, ValueEnum)]
enum Mode {
    /// tokio, current-thread runtime (epoll readiness).
    Epoll,
    /// io_uring completions.
    Uring,
}

fn main() -> io::Result<()> {
    let args = Args::parse();
    let listener = TcpListener::bind(args.listen)?;
    match args.mode {
        Mode::Epoll => epoll(listener, args.upstream),
        Mode::Uring => uring(listener, args.upstream),
    }
}

/// `relay is ready` on stdout, which the scripts wait for.
fn ready() {
    println!("relay is ready");
}

fn epoll(listener: TcpListener, upstream: SocketAddr) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        ready();
        loop {
            let (mut client, _) = listener.accept().await?;
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await else {
                    return;
                };
                if client.set_nodelay(true).is_err() || server.set_nodelay(true).is_err() {
                    return;
                }
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    })
}

/// Bytes read from one socket and not yet all written to the other.
const BUF: usize = 64 * 1024;

/// One direction of a client's relay: from `from` to `to`.
struct Half {
    from: RawFd,
    to: RawFd,
    buf: Box<[u8]>,
    len: usize,
    sent: usize,
}

/// A client's connection and its connection to Postgres. Kept until no operation on either
/// is in flight, since the kernel writes into and reads from the buffers until it completes.
struct Pair {
    _client: TcpStream,
    _server: TcpStream,
    halves: [Half; 2],
    in_flight: u32,
    closing: bool,
}

/// What a completion is for: `user_data` is the pair's index, the direction and the operation.
const ACCEPT: u64 = u64::MAX;
const RECV: u64 = 0;
const SEND: u64 = 1;

fn token(pair: usize, dir: usize, op: u64) -> u64 {
    ((pair as u64) << 2) | ((dir as u64) << 1) | op
}

struct Relay {
    ring: IoUring,
    pairs: Vec<Option<Pair>>,
    free: Vec<usize>,
    /// Entries that did not fit in the submission queue this turn.
    backlog: VecDeque<squeue::Entry>,
}

impl Relay {
    /// Queues `entry`; the caller keeps what it points to alive until it completes.
    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: every entry points into a `Pair`'s buffers or at its sockets, and a pair is
        // dropped only once no operation on it is in flight (`Pair::in_flight`).
        let pushed = unsafe { self.ring.submission().push(&entry) };
        if pushed.is_err() {
            self.backlog.push_back(entry);
        }
    }

    fn recv(&mut self, i: usize, dir: usize) {
        let Some(pair) = self.pairs[i].as_mut() else {
            return;
        };
        let h = &mut pair.halves[dir];
        let entry = opcode::Recv::new(types::Fd(h.from), h.buf.as_mut_ptr(), BUF as u32)
            .build()
            .user_data(token(i, dir, RECV));
        pair.in_flight += 1;
        self.push(entry);
    }

    fn send(&mut self, i: usize, dir: usize) {
        let Some(pair) = self.pairs[i].as_mut() else {
            return;
        };
        let h = &mut pair.halves[dir];
        let rest = &h.buf[h.sent..h.len];
        let entry = opcode::Send::new(types::Fd(h.to), rest.as_ptr(), rest.len() as u32)
            .build()
            .user_data(token(i, dir, SEND));
        pair.in_flight += 1;
        self.push(entry);
    }

    fn accept(&mut self, listener: RawFd) {
        let entry = opcode::Accept::new(
            types::Fd(listener),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
        .build()
        .user_data(ACCEPT);
        self.push(entry);
    }

    /// A new client: its connection to Postgres is made at once (blocking, once per client),
    /// then both directions start receiving.
    fn open(&mut self, fd: RawFd, upstream: SocketAddr) {
        // SAFETY: `fd` is the socket the accept just returned, owned by nobody else.
        let client = unsafe { TcpStream::from_raw_fd(fd) };
        let Ok(server) = TcpStream::connect(upstream) else {
            return;
        };
        if client.set_nodelay(true).is_err() || server.set_nodelay(true).is_err() {
            return;
        }
        let (c, s) = (client.as_raw_fd(), server.as_raw_fd());
        let half = |from, to| Half {
            from,
            to,
            buf: vec![0; BUF].into_boxed_slice(),
            len: 0,
            sent: 0,
        };
        let pair = Pair {
            _client: client,
            _server: server,
            halves: [half(c, s), half(s, c)],
            in_flight: 0,
            closing: false,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.pairs[i] = Some(pair);
                i
            }
            None => {
                self.pairs.push(Some(pair));
                self.pairs.len() - 1
            }
        };
        self.recv(i, 0);
        self.recv(i, 1);
    }

    /// Ends a pair: both sockets are shut down so that what is in flight completes, and the
    /// pair is dropped (closing them) when the last completion arrives.
    fn close(&mut self, i: usize) {
        if let Some(pair) = self.pairs[i].as_mut() {
            if !pair.closing {
                pair.closing = true;
                for h in &pair.halves {
                    // SAFETY: shutting down a socket the pair owns.
                    unsafe { libc::shutdown(h.from, libc::SHUT_RDWR) };
                }
            }
        }
    }

    fn complete(&mut self, user_data: u64, res: i32, listener: RawFd, upstream: SocketAddr) {
        if user_data == ACCEPT {
            if res >= 0 {
                self.open(res, upstream);
            }
            self.accept(listener);
            return;
        }
        let (i, dir, op) = (
            (user_data >> 2) as usize,
            ((user_data >> 1) & 1) as usize,
            user_data & 1,
        );
        let Some(pair) = self.pairs[i].as_mut() else {
            return;
        };
        pair.in_flight -= 1;
        if pair.closing || res <= 0 {
            self.close(i);
            if self.pairs[i].as_ref().is_some_and(|p| p.in_flight == 0) {
                self.pairs[i] = None;
                self.free.push(i);
            }
            return;
        }
        let h = &mut pair.halves[dir];
        let n = res as usize;
        if op == RECV {
            h.len = n;
            h.sent = 0;
            self.send(i, dir);
        } else {
            h.sent += n;
            if h.sent < h.len {
                self.send(i, dir);
            } else {
                self.recv(i, dir);
            }
        }
    }
}

fn uring(listener: TcpListener, upstream: SocketAddr) -> io::Result<()> {
    let mut relay = Relay {
        ring: IoUring::new(1024)?,
        pairs: Vec::new(),
        free: Vec::new(),
        backlog: VecDeque::new(),
    };
    let lfd = listener.as_raw_fd();
    relay.accept(lfd);
    ready();
    let mut done = Vec::new();
    loop {
        match relay.ring.submit_and_wait(1) {
            // A signal (strace attaching, say), or completions to reap first.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EBUSY)) => {}
            other => {
                other?;
            }
        }
        done.extend(relay.ring.completion().map(|c| (c.user_data(), c.result())));
        for (user_data, res) in done.drain(..) {
            relay.complete(user_data, res, lfd, upstream);
        }
        while let Some(entry) = relay.backlog.pop_front() {
            // SAFETY: as in `Relay::push`.
            if unsafe { relay.ring.submission().push(&entry) }.is_err() {
                relay.backlog.push_front(entry);
                break;
            }
        }
    }
}
