//! Links `podnet` as a position-dependent executable.
//!
//! The binary is also every CNI plugin, and a plugin is a process that lives
//! a few milliseconds: as a PIE, the dynamic loader first applies ~17,000
//! relative relocations and copies the pages they land on, about a quarter
//! of a millisecond per call on a 2-core VM (measured with `perf stat` on
//! `CNI_COMMAND=VERSION`, and in `cni-bench`). Linked at a fixed address those
//! relocations are resolved at link time. The code stays position
//! independent; only the executable's own load address stops being
//! randomised (shared libraries, heap and stacks still are), which is also
//! what Go's default build does for the reference plugins.
//!
//! Only for glibc: a musl build (the image) is a static PIE that relocates
//! itself from its own start code, which `-no-pie` breaks.
fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux")
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu")
    {
        println!("cargo:rustc-link-arg-bin=podnet=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
