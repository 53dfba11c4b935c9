//! In-memory session tests (being written).
