//! A client that speaks the wire protocol byte by byte, for the tests that need messages no
//! driver sends in that order (several Bind/Execute pairs before one Sync, Flush without Sync).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::Router;

/// A raw protocol client logged in with trust authentication.
pub struct Raw {
    pub s: TcpStream,
    pub buf: Vec<u8>,
    /// The status of the last ReadyForQuery read.
    pub status: u8,
}

impl Raw {
    pub fn connect(router: &Router) -> Raw {
        let mut s = TcpStream::connect(("127.0.0.1", router.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        let params = b"user\0app\0database\0app\0\0";
        let mut startup = ((8 + params.len()) as i32).to_be_bytes().to_vec();
        startup.extend_from_slice(&196_608i32.to_be_bytes());
        startup.extend_from_slice(params);
        s.write_all(&startup).expect("startup");
        let mut raw = Raw {
            s,
            buf: Vec::new(),
            status: 0,
        };
        let tags = raw.read_until(b'Z');
        assert!(tags.starts_with(b"R"), "{tags:?}");
        raw
    }

    /// Reads whole messages until one with `tag`, returning all their tags in order.
    pub fn read_until(&mut self, tag: u8) -> Vec<u8> {
        self.read_until_with_errors(tag).0
    }

    /// Reads until ReadyForQuery: the tags, and the text of every ErrorResponse.
    pub fn until_ready(&mut self) -> (Vec<u8>, String) {
        self.read_until_with_errors(b'Z')
    }

    /// Reads whole messages until one with `tag`: all their tags in order, and the text of
    /// every ErrorResponse among them.
    pub fn read_until_with_errors(&mut self, tag: u8) -> (Vec<u8>, String) {
        let (mut tags, mut errors) = (Vec::new(), String::new());
        loop {
            while self.buf.len() >= 5 {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() < len + 1 {
                    break;
                }
                let t = self.buf[0];
                tags.push(t);
                if t == b'Z' {
                    self.status = self.buf[5];
                }
                if t == b'E' {
                    errors.push_str(&String::from_utf8_lossy(&self.buf[5..len + 1]));
                }
                self.buf.drain(..len + 1);
                if t == tag {
                    return (tags, errors);
                }
            }
            let mut chunk = [0u8; 8192];
            let n = self.s.read(&mut chunk).expect("read");
            assert!(n > 0, "the router closed the connection; got {tags:?}");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Reads exactly `n` messages.
    pub fn read_n(&mut self, n: usize) -> Vec<u8> {
        let mut tags = Vec::new();
        while tags.len() < n {
            while self.buf.len() >= 5 && tags.len() < n {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() < len + 1 {
                    break;
                }
                tags.push(self.buf[0]);
                self.buf.drain(..len + 1);
            }
            if tags.len() < n {
                let mut chunk = [0u8; 8192];
                let got = self.s.read(&mut chunk).expect("read");
                assert!(got > 0, "closed; got {tags:?}");
                self.buf.extend_from_slice(&chunk[..got]);
            }
        }
        tags
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).expect("write");
    }
}

pub fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

pub fn parse(name: &str, sql: &str) -> Vec<u8> {
    let mut b = format!("{name}\0{sql}\0").into_bytes();
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'P', &b)
}

/// Bind with text parameters.
pub fn bind(statement: &str, params: &[&str]) -> Vec<u8> {
    let mut b = format!("\0{statement}\0").into_bytes();
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&(params.len() as i16).to_be_bytes());
    for p in params {
        b.extend_from_slice(&(p.len() as i32).to_be_bytes());
        b.extend_from_slice(p.as_bytes());
    }
    b.extend_from_slice(&0i16.to_be_bytes());
    msg(b'B', &b)
}

pub fn describe_statement(name: &str) -> Vec<u8> {
    msg(b'D', format!("S{name}\0").as_bytes())
}

pub fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}

pub fn close_statement(name: &str) -> Vec<u8> {
    msg(b'C', format!("S{name}\0").as_bytes())
}

pub fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

pub fn flush() -> Vec<u8> {
    msg(b'H', b"")
}
