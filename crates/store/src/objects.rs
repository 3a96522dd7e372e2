//! objects placeholder
