//! The `.mmir` text format (in progress).
