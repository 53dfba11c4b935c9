//! Extended-protocol messages decoded once, when they arrive ([`Msg`]), and the batch of them
//! that waits for a shard ([`Held`]).
//!
//! A client's Parse, Bind, Describe, Execute and Close are looked at once: the statement they
//! name is found then, and what the session needs to send them on is kept with them. Until a
//! Bind names a shard, messages wait in [`Held`], which owns their bytes; then they go to that
//! shard's connection in order, without being decoded again.

use std::ops::Range;
use std::sync::Arc;

use crate::session::replies::Kind;
use crate::session::statements::ClientStatement;

/// One client message, ready to be sent on. `B` is where its bytes are: borrowed from the
/// client's frame (`&[u8]`), or a range of [`Held`]'s buffer.
#[derive(Debug)]
pub enum Msg<B> {
    /// Parse: the statement it creates.
    Parse(Arc<ClientStatement>),
    /// Bind of `stmt`: the portal name (without its NUL) and everything after the statement
    /// name, as the client sent them.
    Bind {
        portal: B,
        tail: B,
        stmt: Arc<ClientStatement>,
    },
    /// Describe of a statement.
    DescribeStatement(Arc<ClientStatement>),
    /// A message forwarded as it came: Describe or Close of a portal, Execute.
    Forward {
        frame: B,
        kind: Kind,
        /// It runs something (Execute, Close of a portal): the batch cannot move after it.
        executes: bool,
    },
    /// Close of a statement: the router answers it (the client's name is already gone;
    /// backends keep the statement for whoever needs it next).
    CloseStatement,
}

impl<B> Msg<B> {
    /// The same message with its bytes somewhere else.
    fn map<C>(self, mut f: impl FnMut(B) -> C) -> Msg<C> {
        match self {
            Msg::Parse(s) => Msg::Parse(s),
            Msg::Bind { portal, tail, stmt } => Msg::Bind {
                portal: f(portal),
                tail: f(tail),
                stmt,
            },
            Msg::DescribeStatement(s) => Msg::DescribeStatement(s),
            Msg::Forward {
                frame,
                kind,
                executes,
            } => Msg::Forward {
                frame: f(frame),
                kind,
                executes,
            },
            Msg::CloseStatement => Msg::CloseStatement,
        }
    }
}

/// Extended messages waiting for their batch's shard.
#[derive(Debug, Default)]
pub struct Held {
    bytes: Vec<u8>,
    msgs: Vec<Msg<Range<usize>>>,
}

impl Held {
    pub fn push(&mut self, msg: Msg<&[u8]>) {
        let bytes = &mut self.bytes;
        let held = msg.map(|b| {
            let at = bytes.len();
            bytes.extend_from_slice(b);
            at..bytes.len()
        });
        self.msgs.push(held);
    }

    /// Whether every message only prepares statements (no Bind, no Execute, no portal).
    pub fn only_prepares(&self) -> bool {
        self.msgs.iter().all(|m| {
            matches!(
                m,
                Msg::Parse(_) | Msg::DescribeStatement(_) | Msg::CloseStatement
            )
        })
    }

    /// Whether the held messages may go to a shared connection: every statement bound is
    /// shareable (`Plan::shareable`); preparing and describing any statement is.
    pub fn shareable(&self) -> bool {
        self.msgs.iter().all(|m| match m {
            Msg::Bind { stmt, .. } => stmt.plan.shareable,
            _ => true,
        })
    }

    /// Whether any message needs a backend (everything but the Close of a statement does).
    pub fn needs_backend(&self) -> bool {
        self.msgs.iter().any(|m| !matches!(m, Msg::CloseStatement))
    }

    /// The held messages, in order (their bytes stay here).
    pub fn iter(&self) -> impl Iterator<Item = &Msg<Range<usize>>> {
        self.msgs.iter()
    }

    /// Hands every message, in order, to `each`, and leaves this empty (with its room).
    pub fn drain<E>(&mut self, mut each: impl FnMut(Msg<&[u8]>) -> Result<(), E>) -> Result<(), E> {
        let bytes = &self.bytes;
        let mut result = Ok(());
        for m in self.msgs.drain(..) {
            if result.is_ok() {
                result = each(m.map(|range| &bytes[range]));
            }
        }
        self.clear();
        result
    }

    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// The bytes held (bounded by `limits.max_message_bytes` for one batch).
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Drops every message, keeping the room unless a long batch made it grow.
    pub fn clear(&mut self) {
        self.msgs.clear();
        self.bytes.clear();
        if self.bytes.capacity() > crate::session::client::KEEP_AT_REST {
            self.bytes = Vec::new();
        }
    }

    /// The kinds of the held messages, for a batch the router answers itself: `P` Parse, `S`
    /// Describe statement, `B` Bind, `D` Describe portal, `C` Close, `E` Execute.
    pub fn asked(&self) -> impl Iterator<Item = u8> + '_ {
        self.msgs.iter().map(|m| match m {
            Msg::Parse(_) => b'P',
            Msg::DescribeStatement(_) => b'S',
            Msg::Bind { .. } => b'B',
            Msg::Forward {
                kind: Kind::DescribePortal,
                ..
            } => b'D',
            Msg::Forward {
                kind: Kind::Execute,
                ..
            } => b'E',
            Msg::Forward { .. } | Msg::CloseStatement => b'C',
        })
    }
}
