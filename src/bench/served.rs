//! A node as the device-plugin front-end serves it: inventory, config and plan in one store,
//! and what the Allocate and GetPreferredAllocation handlers do with it, without the
//! transport.

use std::hint::black_box;

use crate::domain::allocate;
use crate::domain::cdi::{Format, GenerateOptions};
use crate::domain::config::{self, AllocationPolicy, Overrides};
use crate::domain::inventory::{Backend, Inventory};
use crate::domain::snapshot::Snapshot;
use crate::platform::sim::SimBackend;
use crate::state::Store;

/// One resource of a sim node (a built-in profile or a node file) under a config, served
/// from a store as the daemon serves it.
#[derive(Debug)]
pub struct Served {
    store: Store,
    resource: String,
    policy: AllocationPolicy,
    /// The node's inventory, apart from the store: the spec is generated from it alone.
    inventory: Inventory,
}

impl Served {
    /// `resource` of the sim node `node` (`dgx-h100`, `mixed-a100` or a node file) under the
    /// config text `config`.
    ///
    /// # Panics
    /// When the node, the config or the plan fails, or the plan has no `resource`.
    pub fn new(node: &str, config: &str, resource: &str) -> Self {
        let inventory = SimBackend::open(node)
            .and_then(|b| b.discover())
            .unwrap_or_else(|e| panic!("node {node}: {e}"));
        let config = config::parse(config, "bench", &Overrides::default())
            .unwrap_or_else(|e| panic!("config: {e}"));
        let plan =
            crate::domain::plan::build(&inventory, &config).unwrap_or_else(|e| panic!("plan: {e}"));
        let policy = config.allocation_policy;
        let store = Store::new(Snapshot::serving(config, inventory.clone(), plan));
        assert!(
            store.view(resource).is_some(),
            "{node} serves no {resource}"
        );
        Self {
            store,
            resource: resource.to_string(),
            policy,
            inventory,
        }
    }

    /// The resource's device IDs, in the plan's order.
    ///
    /// # Panics
    /// When the resource is no longer served.
    pub fn devices(&self) -> Vec<String> {
        self.view()
            .resource
            .devices
            .iter()
            .map(|d| d.id.clone())
            .collect()
    }

    fn view(&self) -> std::sync::Arc<crate::domain::view::ResourceView> {
        self.store
            .view(&self.resource)
            .unwrap_or_else(|| panic!("{} not served", self.resource))
    }

    /// One Allocate call's work as the handler does it: one snapshot, the domain's answer
    /// (every rule, all or nothing), and what it hands out recorded in the store. Returns the
    /// number of devices handed out.
    ///
    /// # Panics
    /// When the answer is a refusal.
    pub fn allocate(&self, requests: &[Vec<String>]) -> usize {
        let snapshot = self.store.current();
        let answer = allocate::answer(&snapshot, &self.resource, requests)
            .unwrap_or_else(|e| panic!("allocate: {e}"));
        let grew = self.store.hold(
            &self.resource,
            answer.held.ids.iter().map(String::as_str),
            &answer.held.cdi,
        );
        let n = answer.held.ids.len();
        black_box((answer, grew));
        n
    }

    /// One GetPreferredAllocation call's work as the handler does it: the resource's view,
    /// then the placement of `size` devices among `available` with `must_include`.
    ///
    /// # Panics
    /// When the resource is no longer served.
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Vec<String> {
        let view = self.view();
        allocate::preferred(&view, self.policy, available, must_include, size)
    }

    /// The node's CDI spec (kind `gpu-slicer.io/gpu`, no shares) generated and serialised as
    /// `format` once: the time that took (what it made is freed after the clock is read) and
    /// the number of CDI devices.
    ///
    /// # Panics
    /// When generation or serialisation fails.
    pub fn cdi_spec(&self, format: Format) -> (std::time::Duration, usize) {
        super::cdi::generate_once(
            &self.inventory,
            &GenerateOptions::new("gpu-slicer.io/gpu"),
            format,
        )
    }
}
