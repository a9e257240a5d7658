//! GPU-pair topology: PCIe distance, NVLink width and NUMA node of every pair of GPUs, keyed
//! by PCI bus ID, built once from the raw per-pair answers a backend read (NVML at discovery,
//! the sim backend from a node file) and rendered as `nvidia-smi topo -m` writes it.
//!
//! Pure: backends hand in raw answers ([`RawGpu`], [`RawPair`]), get back a [`Topology`] and
//! the [`TopologyWarning`]s to log. The placement code (`crate::domain::allocate::preferred`)
//! reads pair scores from it through the plan; the DRA driver can read [`placement_attributes`].

use serde::Serialize;

#[cfg(test)]
/// Errors reading a topology matrix written as `nvidia-smi topo -m` rows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TopologyError {
    /// A matrix cell is not one of X, NV#, PIX, PXB, PHB, NODE, SYS.
    #[error("row {row}, column {col}: `{value}` is not X, NV<n>, PIX, PXB, PHB, NODE or SYS")]
    Cell {
        row: usize,
        col: usize,
        value: String,
    },
    /// The matrix is not square with one row per GPU.
    #[error("row {row} has {found} cells, expected {expected} (one per GPU)")]
    Shape {
        row: usize,
        found: usize,
        expected: usize,
    },
}

/// PCIe distance between two GPUs, nearest first (NVML `nvmlGpuTopologyLevel_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub(crate) enum PcieLevel {
    /// At most one PCIe bridge (NVML SINGLE = 10; INTERNAL = 0 is folded in here).
    Pix,
    /// Several PCIe bridges, no host bridge (MULTIPLE = 20).
    Pxb,
    /// Through a PCIe host bridge (HOSTBRIDGE = 30).
    Phb,
    /// Between host bridges of one NUMA node (NODE = 40).
    Node,
    /// Across the SMP interconnect (SYSTEM = 50); also what an unsupported call means.
    Sys,
}

impl PcieLevel {
    /// From NVML's `nvmlGpuTopologyLevel_t` value; `None` for a value NVML does not define.
    pub(crate) fn from_nvml(v: u32) -> Option<Self> {
        Some(match v {
            0 | 10 => Self::Pix,
            20 => Self::Pxb,
            30 => Self::Phb,
            40 => Self::Node,
            50 => Self::Sys,
            _ => return None,
        })
    }

    /// NVML's value for this level.
    pub(crate) fn to_nvml(self) -> u32 {
        match self {
            Self::Pix => 10,
            Self::Pxb => 20,
            Self::Phb => 30,
            Self::Node => 40,
            Self::Sys => 50,
        }
    }

    /// `nvidia-smi topo -m` spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Pix => "PIX",
            Self::Pxb => "PXB",
            Self::Phb => "PHB",
            Self::Node => "NODE",
            Self::Sys => "SYS",
        }
    }

    /// Closeness for scoring: 5 for PIX down to 1 for SYS.
    fn closeness(self) -> u64 {
        match self {
            Self::Pix => 5,
            Self::Pxb => 4,
            Self::Phb => 3,
            Self::Node => 2,
            Self::Sys => 1,
        }
    }
}

/// The link between two GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PairLink {
    /// Common PCIe ancestor.
    pub(crate) pcie: PcieLevel,
    /// NVLink links joining them (direct, or through NVSwitch: the smaller switch-link count).
    pub(crate) nvlinks: u32,
}

impl PairLink {
    /// The matrix cell: `NV#` when NVLink-connected, else the PCIe level.
    pub(crate) fn cell(self) -> String {
        if self.nvlinks > 0 {
            format!("NV{}", self.nvlinks)
        } else {
            self.pcie.as_str().to_string()
        }
    }
}

/// One GPU of the topology.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TopoGpu {
    /// PCI bus ID (`0000:07:00.0`): the key.
    pub(crate) pci_bus_id: String,
    /// NVML index, for the `GPU<i>` labels of the matrix.
    pub(crate) index: u32,
    /// NUMA node, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) numa_node: Option<i64>,
}

/// Every GPU pair's link. `gpus` sorted by bus ID; `links[i * n + j]` is the pair (i, j).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Topology {
    /// GPUs sorted by PCI bus ID.
    pub(crate) gpus: Vec<TopoGpu>,
    /// Row-major n×n; the diagonal is unused (PIX, 0).
    #[serde(skip)]
    pub(crate) links: Vec<PairLink>,
    /// The matrix as `nvidia-smi topo -m` cells, rows and columns in NVML index order.
    pub(crate) matrix: Vec<Vec<String>>,
}

/// What a backend read about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawGpu {
    /// PCI bus ID.
    pub(crate) pci_bus_id: String,
    /// NVML index.
    pub(crate) index: u32,
    /// NUMA node.
    pub(crate) numa_node: Option<i64>,
    /// Enabled NVLink links whose remote end is an NVSwitch.
    pub(crate) switch_links: u32,
}

/// What a backend read about an ordered pair (a, b), from a's side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RawPair {
    /// `nvmlDeviceGetTopologyCommonAncestor` value; `None` when unsupported.
    pub(crate) ancestor: Option<u32>,
    /// Enabled links of a whose remote PCI bus ID is b's.
    pub(crate) direct_nvlinks: u32,
}

/// Something odd in the raw answers, handled and to be logged by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopologyWarning {
    /// The two directions of a pair disagree; the worse answer was kept.
    Asymmetric {
        a: String,
        b: String,
        forward: String,
        backward: String,
    },
    /// The common-ancestor call was unsupported or returned an unknown level: SYS assumed.
    NoPcieAnswer { a: String, b: String },
}

impl Topology {
    /// Build from raw answers; `pair(a, b)` indexes into `gpus` as given.
    pub(crate) fn from_raw(
        gpus: &[RawGpu],
        mut pair: impl FnMut(usize, usize) -> RawPair,
    ) -> (Self, Vec<TopologyWarning>) {
        let n = gpus.len();
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| gpus[a].pci_bus_id.cmp(&gpus[b].pci_bus_id));
        let mut warnings = Vec::new();
        let mut links = vec![
            PairLink {
                pcie: PcieLevel::Pix,
                nvlinks: 0
            };
            n * n
        ];
        for (si, &a) in order.iter().enumerate() {
            for (sj, &b) in order.iter().enumerate().skip(si + 1) {
                let (ga, gb) = (&gpus[a], &gpus[b]);
                let side = |raw: RawPair, warnings: &mut Vec<TopologyWarning>| {
                    let pcie = raw.ancestor.and_then(PcieLevel::from_nvml);
                    if pcie.is_none() {
                        warnings.push(TopologyWarning::NoPcieAnswer {
                            a: ga.pci_bus_id.clone(),
                            b: gb.pci_bus_id.clone(),
                        });
                    }
                    let switched = ga.switch_links.min(gb.switch_links);
                    PairLink {
                        pcie: pcie.unwrap_or(PcieLevel::Sys),
                        nvlinks: raw.direct_nvlinks.max(switched),
                    }
                };
                let fwd = side(pair(a, b), &mut warnings);
                let bwd = side(pair(b, a), &mut warnings);
                let link = if fwd == bwd {
                    fwd
                } else {
                    warnings.push(TopologyWarning::Asymmetric {
                        a: ga.pci_bus_id.clone(),
                        b: gb.pci_bus_id.clone(),
                        forward: fwd.cell(),
                        backward: bwd.cell(),
                    });
                    PairLink {
                        pcie: fwd.pcie.max(bwd.pcie),
                        nvlinks: fwd.nvlinks.min(bwd.nvlinks),
                    }
                };
                links[si * n + sj] = link;
                links[sj * n + si] = link;
            }
        }
        let sorted: Vec<TopoGpu> = order
            .iter()
            .map(|&i| TopoGpu {
                pci_bus_id: gpus[i].pci_bus_id.clone(),
                index: gpus[i].index,
                numa_node: gpus[i].numa_node,
            })
            .collect();
        (Self::assemble(sorted, links), warnings)
    }

    fn assemble(gpus: Vec<TopoGpu>, links: Vec<PairLink>) -> Self {
        let n = gpus.len();
        let mut by_index: Vec<usize> = (0..n).collect();
        by_index.sort_by_key(|&i| gpus[i].index);
        let matrix = by_index
            .iter()
            .map(|&i| {
                by_index
                    .iter()
                    .map(|&j| {
                        if i == j {
                            "X".to_string()
                        } else {
                            links[i * n + j].cell()
                        }
                    })
                    .collect()
            })
            .collect();
        Self {
            gpus,
            links,
            matrix,
        }
    }

    /// Number of GPUs.
    pub(crate) fn len(&self) -> usize {
        self.gpus.len()
    }

    /// Position of a GPU by PCI bus ID.
    pub(crate) fn position(&self, pci_bus_id: &str) -> Option<usize> {
        self.gpus
            .binary_search_by(|g| g.pci_bus_id.as_str().cmp(pci_bus_id))
            .ok()
    }

    /// The link between positions `a` and `b`.
    pub(crate) fn link(&self, a: usize, b: usize) -> PairLink {
        self.links[a * self.len() + b]
    }

    /// Pair score: NVLink count first, then PCIe closeness, then same NUMA node, packed so
    /// that sums compare lexicographically (each field has 20 bits of head room: 2^20 / 5
    /// pairs ≫ C(64, 2)).
    pub(crate) fn pair_score(&self, a: usize, b: usize) -> u64 {
        let l = self.link(a, b);
        let same_numa = match (self.gpus[a].numa_node, self.gpus[b].numa_node) {
            (Some(x), Some(y)) => u64::from(x == y),
            _ => 0,
        };
        (u64::from(l.nvlinks) << 40) | (l.pcie.closeness() << 20) | same_numa
    }

    /// The `nvidia-smi topo -m`-style matrix with its legend.
    pub(crate) fn render(&self) -> String {
        let mut by_index: Vec<usize> = (0..self.len()).collect();
        by_index.sort_by_key(|&i| self.gpus[i].index);
        let cells: Vec<Vec<&str>> = self
            .matrix
            .iter()
            .map(|row| row.iter().map(String::as_str).collect())
            .collect();
        let rows: Vec<node_spec::TopoRow<'_>> = by_index
            .iter()
            .zip(&cells)
            .map(|(&i, cells)| node_spec::TopoRow {
                index: self.gpus[i].index,
                cells,
                numa_node: self.gpus[i].numa_node,
            })
            .collect();
        node_spec::render_topo_matrix(&rows)
    }
}

/// A resource's devices placed in the topology (built by the planner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceLinks {
    /// The node's topology.
    pub(crate) topology: std::sync::Arc<Topology>,
    /// Position in `topology` of device i's GPU, `None` when the GPU is not in it.
    pub(crate) slot: Vec<Option<usize>>,
}

#[cfg(test)]
/// One matrix cell as written in a node file or by `nvidia-smi topo -m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cell {
    /// The diagonal.
    Diagonal,
    /// NVLink-connected with this many links.
    NvLink(u32),
    /// PCIe only.
    Pcie(PcieLevel),
}

#[cfg(test)]
/// Parse one cell (`X`, `NV12`, `PIX`, …).
pub(crate) fn parse_cell(s: &str) -> Option<Cell> {
    Some(match s {
        "X" => Cell::Diagonal,
        "PIX" => Cell::Pcie(PcieLevel::Pix),
        "PXB" => Cell::Pcie(PcieLevel::Pxb),
        "PHB" => Cell::Pcie(PcieLevel::Phb),
        "NODE" => Cell::Pcie(PcieLevel::Node),
        "SYS" => Cell::Pcie(PcieLevel::Sys),
        _ => Cell::NvLink(s.strip_prefix("NV")?.parse().ok().filter(|&k| k > 0)?),
    })
}

#[cfg(test)]
/// Parse matrix rows (whitespace-separated cells, rows and columns in GPU index order).
pub(crate) fn parse_matrix(rows: &[String]) -> Result<Vec<Vec<Cell>>, TopologyError> {
    let n = rows.len();
    rows.iter()
        .enumerate()
        .map(|(r, row)| {
            let cells: Vec<&str> = row.split_whitespace().collect();
            if cells.len() != n {
                return Err(TopologyError::Shape {
                    row: r,
                    found: cells.len(),
                    expected: n,
                });
            }
            cells
                .iter()
                .enumerate()
                .map(|(c, v)| {
                    parse_cell(v).ok_or_else(|| TopologyError::Cell {
                        row: r,
                        col: c,
                        value: v.to_string(),
                    })
                })
                .collect()
        })
        .collect()
}

/// Attributes a DRA driver publishes per GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlacementAttributes {
    /// PCI bus ID of the GPU.
    pub(crate) pci_bus_id: String,
    /// Id of the group of GPUs that share a PCIe host bridge or better (PHB or nearer), in
    /// the `pci<domain>:<bus>` form of `resource.kubernetes.io/pcieRoot`, named after the
    /// group's lowest bus ID. A stand-in where sysfs (the authoritative root) is unavailable.
    pub(crate) pcie_root: String,
    /// Id of the NVLink-connected group (`nvl-<lowest bus ID>`), `None` for a GPU without
    /// NVLink peers: the `gpu-slicer.io/nvlinkDomain` attribute.
    pub(crate) nvlink_domain: Option<String>,
}

/// Each GPU's PCIe-root group and NVLink domain, in bus-ID order.
pub(crate) fn placement_attributes(t: &Topology) -> Vec<PlacementAttributes> {
    let n = t.len();
    let component = |joined: &dyn Fn(PairLink) -> bool| {
        // Union by smallest member: n is small, a fixpoint over pairs is enough.
        let mut root: Vec<usize> = (0..n).collect();
        let mut changed = true;
        while changed {
            changed = false;
            for a in 0..n {
                for b in 0..n {
                    if a != b && joined(t.link(a, b)) && root[b] < root[a] {
                        root[a] = root[b];
                        changed = true;
                    }
                }
            }
        }
        root
    };
    let pcie = component(&|l| l.pcie <= PcieLevel::Phb);
    let nvl = component(&|l| l.nvlinks > 0);
    (0..n)
        .map(|i| {
            let bus = &t.gpus[pcie[i]].pci_bus_id;
            let mut parts = bus.split(':');
            let domain = parts.next().unwrap_or("0000");
            let b = parts.next().unwrap_or("00");
            let has_peer = (0..n).any(|j| j != i && t.link(i, j).nvlinks > 0);
            PlacementAttributes {
                pci_bus_id: t.gpus[i].pci_bus_id.clone(),
                pcie_root: format!("pci{domain}:{b}"),
                nvlink_domain: has_peer.then(|| format!("nvl-{}", t.gpus[nvl[i]].pci_bus_id)),
            }
        })
        .collect()
}

#[cfg(test)]
/// Build a topology from parsed matrix cells (sim backend). `gpus` in index order, matching
/// the matrix rows. A matrix entry is read from the row's side, so an asymmetric matrix
/// gives the same warnings NVML's answers would.
pub(crate) fn from_cells(gpus: &[RawGpu], cells: &[Vec<Cell>]) -> (Topology, Vec<TopologyWarning>) {
    Topology::from_raw(gpus, |a, b| match cells.get(a).and_then(|r| r.get(b)) {
        Some(Cell::NvLink(k)) => RawPair {
            ancestor: Some(PcieLevel::Sys.to_nvml()),
            direct_nvlinks: *k,
        },
        Some(Cell::Pcie(l)) => RawPair {
            ancestor: Some(l.to_nvml()),
            direct_nvlinks: 0,
        },
        _ => RawPair::default(),
    })
}

/// The clique a GPU's fabric registration places it in, by go-nvlib's `IsFabricAttached`
/// rule: registration completed (`state` 3) with status SUCCESS and a non-zero cluster UUID
/// (NVLink systems that are not multi-node capable report a zero one). The value is GFD's
/// `nvidia.com/gpu.clique`: `<cluster UUID>.<clique ID in decimal>`.
pub(crate) fn fabric_clique(
    cluster_uuid: [u8; 16],
    clique_id: u32,
    state: u8,
    status: u32,
) -> Option<String> {
    if state != 3 || status != 0 || cluster_uuid == [0; 16] {
        return None;
    }
    let h: String = cluster_uuid.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!(
        "{}-{}-{}-{}-{}.{clique_id}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    ))
}

pub(crate) mod search;

#[cfg(test)]
pub(crate) mod layouts;
#[cfg(test)]
mod tests;
