//! The verifier (in progress).
