//! petgraph views (in progress).
