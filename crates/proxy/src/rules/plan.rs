//! Whole tables and per-Service fragments: a full plan is the base table
//! plus every Service; a fragment is one Service over the empty shell, so
//! the proxier can diff old and new fragments of a changed Service and
//! merge fragments into what it applied.

use podnet_api::k8s_openapi::api::core::v1::Service;
use podnet_api::k8s_openapi::api::discovery::v1::EndpointSlice;
use podnet_nft::model::Table;

use super::service::add_service;
use super::{base_table, shell, NodeInfo, ProxyInput, Stack};

/// One Service's contribution: its map elements, chains and affinity sets.
/// Diffing old and new fragments is how a change to one Service costs work
/// proportional to that Service alone.
pub fn fragment(
    svc: Option<&Service>,
    slices: &[EndpointSlice],
    node: &NodeInfo,
    stack: &Stack,
) -> Table {
    let mut t = shell(stack);
    if let Some(svc) = svc {
        add_service(&mut t, svc, slices, node, stack);
    }
    t
}

/// Adds a fragment's elements, sets and chains to a table.
pub fn merge(t: &mut Table, f: &Table) {
    for (name, set) in &f.sets {
        match t.sets.get_mut(name) {
            Some(s) => s
                .elements
                .extend(set.elements.iter().map(|(k, v)| (k.clone(), v.clone()))),
            None => {
                t.sets.insert(name.clone(), set.clone());
            }
        }
    }
    for (name, c) in &f.chains {
        t.chains.insert(name.clone(), c.clone());
    }
}

/// Plans the whole table (full syncs and tests).
pub fn plan(input: &ProxyInput<'_>) -> Table {
    let mut t = base_table(&input.stack, input.node);
    for svc in input.services {
        add_service(&mut t, svc, input.slices, input.node, &input.stack);
    }
    t
}
