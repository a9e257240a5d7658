//! The reference layouts (`nvidia-smi topo -m` matrices of real machines, see the book's
//! "Topology" chapter, docs/src/topology.md) as [`Topology`] values, for tests. The node files under
//! `hack/nodes/topo-*.yaml` carry the same matrices.

use super::{Cell, RawGpu, Topology, from_cells, parse_matrix};

/// A reference layout: name, matrix rows (index order) and NUMA node per GPU.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    /// Short name, also the node file's `topo-<name>.yaml`.
    pub(crate) name: &'static str,
    /// Matrix rows.
    pub(crate) rows: Vec<String>,
    /// NUMA node of GPU i.
    pub(crate) numa: Vec<i64>,
}

fn build(
    name: &'static str,
    n: usize,
    numa: impl Fn(usize) -> i64,
    cell: impl Fn(usize, usize) -> &'static str,
) -> Layout {
    let rows = (0..n)
        .map(|i| {
            (0..n)
                .map(|j| if i == j { "X" } else { cell(i, j) })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    Layout {
        name,
        rows,
        numa: (0..n).map(numa).collect(),
    }
}

/// The five reference layouts of the notes plus a 16-GPU one.
pub(crate) fn reference() -> Vec<Layout> {
    let half = |i: usize| i64::from(i >= 4);
    vec![
        // HGX H100: every pair NV18 through NVSwitch.
        build("nvswitch-h100", 8, half, |_, _| "NV18"),
        // NVIDIA/k8s-device-plugin#546: bridged pairs 0-2, 1-3, 4-5, 6-7.
        build("bridged-pairs", 8, half, |i, j| {
            let pair = |x: usize| match x {
                0 | 2 => 0,
                1 | 3 => 1,
                4 | 5 => 2,
                _ => 3,
            };
            if pair(i) == pair(j) { "NV12" } else { "SYS" }
        }),
        // 8-GPU PCIe, dual socket, two switches per socket.
        build("pcie-dual-socket", 8, half, |i, j| {
            if i / 4 != j / 4 {
                "SYS"
            } else if i / 2 == j / 2 {
                "PIX"
            } else {
                "PXB"
            }
        }),
        // 4 × L40S: NODE within a socket, SYS across.
        build(
            "l40s-4",
            4,
            |i| i64::from(i >= 2),
            |i, j| if i / 2 == j / 2 { "NODE" } else { "SYS" },
        ),
        // 5-GPU workstation: GPU0 alone on NUMA 1; 1-2 and 3-4 PHB, {1,2}-{3,4} NODE.
        build(
            "workstation-5",
            5,
            |i| i64::from(i == 0),
            |i, j| {
                let grp = |x: usize| match x {
                    0 => 0,
                    1 | 2 => 1,
                    _ => 2,
                };
                if grp(i) == 0 || grp(j) == 0 {
                    "SYS"
                } else if grp(i) == grp(j) {
                    "PHB"
                } else {
                    "NODE"
                }
            },
        ),
        // 16 GPUs: NV4 pairs (2i, 2i+1), PXB within a quad, NODE within a socket, SYS across.
        build(
            "pairs-16",
            16,
            |i| i64::from(i >= 8),
            |i, j| {
                if i / 2 == j / 2 {
                    "NV4"
                } else if i / 4 == j / 4 {
                    "PXB"
                } else if i / 8 == j / 8 {
                    "NODE"
                } else {
                    "SYS"
                }
            },
        ),
    ]
}

impl Layout {
    /// Bus ID of GPU i (`0000:<0x10 + 8·i>:00.0`), as in `hack/nodes/topo-*.yaml`.
    pub(crate) fn bus_id(i: usize) -> String {
        format!("0000:{:02x}:00.0", 0x10 + 8 * i)
    }

    /// The topology, as the sim backend would build it.
    pub(crate) fn topology(&self) -> Topology {
        let gpus: Vec<RawGpu> = (0..self.rows.len())
            .map(|i| RawGpu {
                pci_bus_id: Self::bus_id(i),
                index: i as u32,
                numa_node: Some(self.numa[i]),
                switch_links: 0,
            })
            .collect();
        let cells: Vec<Vec<Cell>> = parse_matrix(&self.rows).unwrap_or_default();
        from_cells(&gpus, &cells).0
    }
}
