//! Which node takes which packed GPU, and the pools that follow.
//!
//! GPUs of one model are interchangeable, so a node's packed GPUs are numbered 0.. on that
//! node in the plan (the config's `devices` and the layout's `devices` name those indices),
//! whatever their UUIDs. Packed GPUs are sorted by shape (whole GPUs first, then MIG layouts,
//! then replica counts) and dealt to the model's nodes in name order, so that most nodes get
//! one shape on every GPU; a node's list of shapes is its pool, named `<model>-<n>` in order of
//! first appearance. Nodes left with only whole GPUs (training nodes, freed nodes) are in
//! `default`, the config with no sharing.

use std::collections::BTreeMap;

use super::ModelPlan;
use super::input::Export;
use super::pack::GpuShape;

/// The pool of nodes without sharing.
pub(crate) const DEFAULT_POOL: &str = "default";

/// The extended resource of a `k`-way replica of a GPU of model `slug`.
pub(crate) fn replica_resource(slug: &str, k: u64) -> String {
    format!("nvidia.com/{slug}.shared-{k}")
}

/// One node in the plan.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodePlan {
    /// Node name.
    pub(crate) node: String,
    /// Its GPU model.
    pub(crate) model: String,
    /// Its pool (the config key and MIG layout name).
    pub(crate) pool: String,
    /// GPUs it has.
    pub(crate) gpus: usize,
    /// GPUs the plan uses on it.
    pub(crate) used: usize,
    /// Packed GPUs on it: (model index, bin index) per used GPU index.
    pub(crate) bins: Vec<(usize, usize)>,
}

/// A pool: nodes of one model with the same shape on each GPU index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Pool {
    /// Name (`default` or `<model>-<n>`).
    pub(crate) name: String,
    /// Model slug.
    pub(crate) slug: String,
    /// GPU memory of the model, bytes.
    pub(crate) memory_bytes: u64,
    /// Shape per GPU index.
    pub(crate) shapes: Vec<GpuShape>,
    /// Nodes in it.
    pub(crate) nodes: usize,
}

/// Nodes and pools.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Fleet {
    /// Nodes, sorted by name.
    pub(crate) nodes: Vec<NodePlan>,
    /// Sharing pools, by name (`default` is not listed: it needs no sharing config).
    pub(crate) pools: Vec<Pool>,
    /// Packed GPUs that found no node (more than the model's GPUs in the export).
    pub(crate) unplaced: usize,
}

fn rank(shape: &GpuShape) -> u8 {
    match shape {
        GpuShape::Whole => 0,
        GpuShape::Mig(_) => 1,
        GpuShape::Replicas { .. } => 2,
    }
}

/// Deal each model's packed GPUs to its nodes.
pub(crate) fn place(export: &Export, models: &[ModelPlan]) -> Fleet {
    // (model, memory) -> node -> GPU count
    let mut nodes_of: BTreeMap<(&str, u64), BTreeMap<&str, usize>> = BTreeMap::new();
    for g in &export.gpus {
        *nodes_of
            .entry((g.model.as_str(), g.memory_total_bytes))
            .or_default()
            .entry(g.node.as_str())
            .or_default() += 1;
    }
    let mut fleet = Fleet::default();
    let mut pools: BTreeMap<(String, Vec<GpuShape>), String> = BTreeMap::new();
    let mut pool_list: Vec<Pool> = Vec::new();
    for (mi, m) in models.iter().enumerate() {
        let mut order: Vec<usize> = (0..m.bins.len()).collect();
        order.sort_by(|&a, &b| {
            let (x, y) = (&m.bins[a].shape, &m.bins[b].shape);
            (rank(x), x, a).cmp(&(rank(y), y, b))
        });
        let mut next = order.into_iter();
        let empty = BTreeMap::new();
        let nodes = nodes_of
            .get(&(m.model.as_str(), m.memory_bytes))
            .unwrap_or(&empty);
        for (&node, &count) in nodes {
            let bins: Vec<(usize, usize)> = next.by_ref().take(count).map(|b| (mi, b)).collect();
            let mut shapes: Vec<GpuShape> =
                bins.iter().map(|&(_, b)| m.bins[b].shape.clone()).collect();
            shapes.resize(count, GpuShape::Whole);
            let pool = if shapes.iter().all(|s| *s == GpuShape::Whole) {
                DEFAULT_POOL.to_string()
            } else {
                let n = pool_list.iter().filter(|p| p.slug == m.slug).count() + 1;
                let name = pools
                    .entry((m.slug.clone(), shapes.clone()))
                    .or_insert_with(|| {
                        let name = format!("{}-{n}", m.slug);
                        pool_list.push(Pool {
                            name: name.clone(),
                            slug: m.slug.clone(),
                            memory_bytes: m.memory_bytes,
                            shapes: shapes.clone(),
                            nodes: 0,
                        });
                        name
                    })
                    .clone();
                if let Some(p) = pool_list.iter_mut().find(|p| p.name == name) {
                    p.nodes += 1;
                }
                name
            };
            fleet.nodes.push(NodePlan {
                node: node.to_string(),
                model: m.model.clone(),
                pool,
                gpus: count,
                used: bins.len(),
                bins,
            });
        }
        fleet.unplaced += next.count();
    }
    fleet.nodes.sort_by(|a, b| a.node.cmp(&b.node));
    pool_list.sort_by(|a, b| a.name.cmp(&b.name));
    fleet.pools = pool_list;
    fleet
}
