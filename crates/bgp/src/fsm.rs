//! One BGP session's finite state machine (RFC 4271 §8): pure.
