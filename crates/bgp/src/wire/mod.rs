//! BGP messages as bytes and back.
