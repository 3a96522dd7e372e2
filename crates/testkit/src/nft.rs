//! What the kernel's nftables hold, read through the `nft` CLI: podnet
//! writes its tables over netlink, so the CLI is an independent witness.

use crate::ns::shell;

/// `nft ARGS` in the named namespace (`None`: this process's own). ARGS go
/// through the shell, so quoting works (`add chain inet t c '{ ... }'`).
/// Its stdout, or its stderr as the error.
pub fn nft(ns: Option<&str>, args: &str) -> Result<String, String> {
    let out = shell(ns, &format!("nft {args}"));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `nft list WHAT` (`ruleset`, `tables`, `table ip podnet`, `map ip podnet
/// service-ips`, ...): the listing, or `None` when there is no such
/// object. Any other failure (no nft, a typo) fails the test.
pub fn nft_list(ns: Option<&str>, what: &str) -> Option<String> {
    absent_is_none(ns, what, nft(ns, &format!("list {what}")))
}

/// `nft -j list WHAT`, parsed; `None` when there is no such object.
pub fn nft_list_json(ns: Option<&str>, what: &str) -> Option<serde_json::Value> {
    let text = absent_is_none(ns, what, nft(ns, &format!("-j list {what}")))?;
    Some(
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("nft -j list {what}: not JSON ({e}): {text}")),
    )
}

fn absent_is_none(ns: Option<&str>, what: &str, r: Result<String, String>) -> Option<String> {
    match r {
        Ok(text) => Some(text),
        Err(e) if e.contains("No such file or directory") => None,
        Err(e) => panic!("nft list {what} in {}: {e}", ns.unwrap_or("this namespace")),
    }
}
