//! The ports Gateway listeners may open. The gateway runs with the
//! host's network, so a listener is a port on the node: whoever may
//! create a Gateway could otherwise open any port there (22, 25, 53…)
//! to the world. Listeners on other ports are refused in their status
//! (`Accepted` False, `PortUnavailable`), as the spec names it.

use std::fmt;

/// Port ranges, e.g. `80,443,1024-65535`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSet(Vec<(u16, u16)>);

/// The default: HTTP's and HTTPS's ports and every unprivileged one.
pub const DEFAULT: &str = "80,443,1024-65535";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PortSetError {
    #[error("{0:?} is not a port or a range FIRST-LAST of ports 1-65535")]
    Bad(String),
    #[error("{0:?}: the range ends before it starts")]
    Backwards(String),
}

impl PortSet {
    pub fn parse(s: &str) -> Result<PortSet, PortSetError> {
        let port = |p: &str, whole: &str| match p.trim().parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(PortSetError::Bad(whole.to_string())),
        };
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (port(a, part)?, port(b, part)?),
                None => (port(part, part)?, port(part, part)?),
            };
            if b < a {
                return Err(PortSetError::Backwards(part.to_string()));
            }
            out.push((a, b));
        }
        if out.is_empty() {
            return Err(PortSetError::Bad(s.to_string()));
        }
        Ok(PortSet(out))
    }

    pub fn contains(&self, p: u16) -> bool {
        self.0.iter().any(|(a, b)| (*a..=*b).contains(&p))
    }
}

impl Default for PortSet {
    fn default() -> Self {
        PortSet::parse(DEFAULT).expect("the default parses")
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (a, b)) in self.0.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            match a == b {
                true => write!(f, "{sep}{a}")?,
                false => write!(f, "{sep}{a}-{b}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_are_named() {
        let s = PortSet::parse("80, 443,1024-65535").unwrap();
        assert!(s.contains(80) && s.contains(443) && s.contains(1024) && s.contains(65535));
        assert!(!s.contains(22) && !s.contains(1023) && !s.contains(81));
        assert_eq!(s.to_string(), DEFAULT);
        assert_eq!(
            PortSet::parse("80,ssh"),
            Err(PortSetError::Bad("ssh".into()))
        );
        assert_eq!(
            PortSet::parse("9000-8000"),
            Err(PortSetError::Backwards("9000-8000".into()))
        );
        assert_eq!(PortSet::parse("0"), Err(PortSetError::Bad("0".into())));
        assert!(PortSet::parse("").is_err());
    }
}
