//! Detached link deletion against the real kernel: a veth pair between two
//! private namespaces.

use podnet_kernel::detach::{delete_link_detached, LinkRef};
use podnet_kernel::Handle;
use podnet_testkit::TestNs;

#[test]
fn detached_delete_removes_both_ends() {
    let guards = (TestNs::new("detach-host"), TestNs::new("detach-pod"));
    let (host, pod) = (guards.0.netns(), guards.1.netns());
    let mut h = Handle::in_netns(host).unwrap();
    let mut p = Handle::in_netns(pod).unwrap();
    h.create_veth("vdt0", "eth0", Some(pod.fd()), None, None)
        .unwrap();
    let hv = h.require_link("vdt0").unwrap();
    let pv = p.require_link("eth0").unwrap();
    h.set_up(hv.index).unwrap();
    p.set_up(pv.index).unwrap();
    delete_link_detached(
        LinkRef {
            ns: Some(pod),
            index: pv.index,
        },
        &[LinkRef {
            ns: Some(host),
            index: hv.index,
        }],
    )
    .unwrap();
    // Gone from both namespaces the moment the call returns.
    assert!(p.link_by_index(pv.index).unwrap().is_none());
    assert!(h.link("vdt0").unwrap().is_none());
    // A link that is not there is reported as such.
    let e = delete_link_detached(
        LinkRef {
            ns: Some(pod),
            index: 4242,
        },
        &[],
    )
    .unwrap_err();
    assert!(e.is_not_found(), "{e}");
}
