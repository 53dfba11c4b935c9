//! The control port: line commands that change a route while traffic flows.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;

use super::link::*;
use super::*;

pub(super) fn control_loop(routes: Arc<Vec<Arc<RouteState>>>, listener: TcpListener) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let routes = Arc::clone(&routes);
                if let Err(e) = spawn("proxy-ctl", move || control_session(&routes, stream)) {
                    eprintln!("loadgen proxy: control: cannot start a thread: {e}");
                }
            }
            Err(e) => {
                eprintln!("loadgen proxy: control: cannot accept: {e}");
                thread::sleep(ACCEPT_RETRY_PAUSE);
            }
        }
    }
}

/// Answers the commands of one control connection, a line each, until it closes.
pub(super) fn control_session(routes: &[Arc<RouteState>], stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut out = &stream;
    for line in BufReader::new(&stream).split(b'\n') {
        let Ok(line) = line else {
            break;
        };
        let line = String::from_utf8_lossy(&line);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let reply = match execute(routes, line) {
            Ok(mut lines) => {
                lines.push("ok".to_string());
                lines.join("\n")
            }
            Err(e) => format!("error: {e}"),
        };
        if out.write_all(format!("{reply}\n").as_bytes()).is_err() {
            break;
        }
    }
}

/// Carries out one control command; the lines to print before `ok`, or what is wrong.
pub(super) fn execute(routes: &[Arc<RouteState>], line: &str) -> Result<Vec<String>, String> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        ["status"] => Ok(routes.iter().map(|r| r.status_line()).collect()),
        ["status", route] => Ok(select(routes, route)?
            .iter()
            .map(|r| r.status_line())
            .collect()),
        ["delay", route, micros] => {
            let chosen = select(routes, route)?;
            let us = parse_micros(micros)?;
            chosen.iter().for_each(|r| r.set_delay(us));
            Ok(Vec::new())
        }
        [verb @ ("cut" | "blackhole" | "heal"), route] => {
            let mode = match *verb {
                "cut" => Mode::Cut,
                "blackhole" => Mode::Blackhole,
                _ => Mode::Pass,
            };
            select(routes, route)?.iter().for_each(|r| r.set_mode(mode));
            Ok(Vec::new())
        }
        [verb, ..] => Err(usage(verb)),
        [] => Err("empty command".to_string()),
    }
}

/// What is wrong with a command line whose first word is `verb`.
pub(super) fn usage(verb: &str) -> String {
    match verb {
        "delay" => "delay takes a route and a number of microseconds: delay ROUTE MICROS".into(),
        "cut" | "blackhole" | "heal" => format!("{verb} takes one route: {verb} ROUTE"),
        "status" => "status takes at most one route: status [ROUTE]".into(),
        _ => format!(
            "unknown command {verb:?}; the commands are delay ROUTE MICROS, cut ROUTE, \
             blackhole ROUTE, heal ROUTE and status [ROUTE]"
        ),
    }
}

/// The routes a command names: one by its listen port, or `all`.
pub(super) fn select<'a>(
    routes: &'a [Arc<RouteState>],
    word: &str,
) -> Result<Vec<&'a RouteState>, String> {
    if word == "all" {
        return Ok(routes.iter().map(|r| &**r).collect());
    }
    let ports = routes
        .iter()
        .map(|r| r.port().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let port: u16 = word.parse().map_err(|_| {
        format!("{word:?} is not a route: name one by its listen port ({ports}) or say all")
    })?;
    let chosen: Vec<&RouteState> = routes
        .iter()
        .filter(|r| r.port() == port)
        .map(|r| &**r)
        .collect();
    if chosen.is_empty() {
        return Err(format!(
            "no route listens on port {port}; the routes listen on {ports}"
        ));
    }
    Ok(chosen)
}

pub(super) fn parse_micros(word: &str) -> Result<u64, String> {
    let us: u64 = word.parse().map_err(|_| {
        format!("{word:?} is not a delay: give a whole number of microseconds, e.g. 500")
    })?;
    check_delay(us)?;
    Ok(us)
}
