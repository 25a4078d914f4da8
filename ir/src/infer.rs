//! Shape and type inference (in progress).
