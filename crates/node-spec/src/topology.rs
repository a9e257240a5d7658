//! The `topology` section of a node file: the GPU×GPU matrix as `nvidia-smi topo -m` prints
//! it (rows and columns in GPU index order), plus how the fake NVML answers NVLink calls.
//! Read by the sim backend (inventory topology), the fake NVML (topology calls) and
//! `fake-nvidia-smi topo -m`.

use std::fmt::Write;

use serde::{Deserialize, Serialize};

/// One GPU's row of the printed matrix: its NVML index, its cells (columns in index order)
/// and its NUMA node.
#[derive(Debug, Clone, Copy)]
pub struct TopoRow<'a> {
    /// NVML index (`GPU<i>`).
    pub index: u32,
    /// Cells, one per GPU, as written (`X`, `NV12`, `SYS`, …).
    pub cells: &'a [&'a str],
    /// NUMA node, `N/A` when unknown.
    pub numa_node: Option<i64>,
}

/// The matrix laid out as `nvidia-smi topo -m` prints it, legend included; one layout for
/// `gpu-slicer inventory --topology` and `fake-nvidia-smi topo -m`.
pub fn render_topo_matrix(rows: &[TopoRow<'_>]) -> String {
    let mut out = String::new();
    for r in rows {
        let _ = write!(out, "\tGPU{}", r.index);
    }
    out.push_str("\tNUMA Affinity\n");
    for r in rows {
        let _ = write!(out, "GPU{}", r.index);
        for cell in r.cells {
            if *cell == "X" {
                out.push_str("\t X ");
            } else {
                let _ = write!(out, "\t{cell}");
            }
        }
        match r.numa_node {
            Some(n) => {
                let _ = writeln!(out, "\t{n}");
            }
            None => out.push_str("\tN/A\n"),
        }
    }
    out.push_str(LEGEND);
    out
}

const LEGEND: &str = "
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
";

/// GPU-pair topology of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TopologySpec {
    /// One row per GPU (index order), cells separated by spaces: `X` on the diagonal, else
    /// `NV<n>`, `PIX`, `PXB`, `PHB`, `NODE` or `SYS`. Row i, column j is what GPU i's side
    /// reports about j, so an asymmetric matrix models asymmetric driver answers.
    pub matrix: Vec<String>,
    /// NVLink goes through NVSwitches: the fake NVML reports each GPU's links as switch
    /// links (remote device type SWITCH) rather than naming the peer GPU. The link count of
    /// GPU i is the largest `NV<n>` of its row.
    #[serde(default)]
    pub nvswitch: bool,
    /// Fake NVML only: topology calls to answer NOT_SUPPORTED (`commonAncestor`, `nvlink`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unsupported: Vec<String>,
}

/// A parsed cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopoCell {
    /// Diagonal.
    SelfCell,
    /// `NV<n>`.
    NvLink(u32),
    /// PCIe level as NVML's `nvmlGpuTopologyLevel_t` value (10 PIX … 50 SYS).
    Pcie(u32),
}

/// Parse a cell.
pub fn parse_cell(s: &str) -> Option<TopoCell> {
    Some(match s {
        "X" => TopoCell::SelfCell,
        "PIX" => TopoCell::Pcie(10),
        "PXB" => TopoCell::Pcie(20),
        "PHB" => TopoCell::Pcie(30),
        "NODE" => TopoCell::Pcie(40),
        "SYS" => TopoCell::Pcie(50),
        _ => TopoCell::NvLink(s.strip_prefix("NV")?.parse().ok().filter(|&k| k > 0)?),
    })
}

impl TopologySpec {
    /// Cell (i, j), `None` when out of range.
    pub fn cell(&self, i: usize, j: usize) -> Option<TopoCell> {
        parse_cell(self.matrix.get(i)?.split_whitespace().nth(j)?)
    }

    /// NVLink links of GPU i on an NVSwitch board (largest `NV<n>` of its row).
    pub fn switch_links(&self, i: usize) -> u32 {
        let n = self.matrix.len();
        (0..n)
            .filter_map(|j| match self.cell(i, j) {
                Some(TopoCell::NvLink(k)) => Some(k),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether the named call is marked unsupported.
    pub fn is_unsupported(&self, call: &str) -> bool {
        self.unsupported.iter().any(|c| c == call)
    }

    /// Check shape and spelling; `gpus` is the node's GPU count. Returns (field, message).
    pub fn check(&self, gpus: usize) -> Result<(), (String, String)> {
        if self.matrix.len() != gpus {
            return Err((
                "topology.matrix".into(),
                format!(
                    "{} rows for {gpus} GPUs (one row per GPU)",
                    self.matrix.len()
                ),
            ));
        }
        for (r, row) in self.matrix.iter().enumerate() {
            let cells: Vec<&str> = row.split_whitespace().collect();
            if cells.len() != gpus {
                return Err((
                    format!("topology.matrix[{r}]"),
                    format!("`{row}` has {} cells, expected {gpus}", cells.len()),
                ));
            }
            for (c, v) in cells.iter().enumerate() {
                let ok = match parse_cell(v) {
                    Some(TopoCell::SelfCell) => r == c,
                    Some(_) => r != c,
                    None => false,
                };
                if !ok {
                    return Err((
                        format!("topology.matrix[{r}]"),
                        format!(
                            "cell {c} `{v}`: expected X on the diagonal, else NV<n>, PIX, PXB, PHB, NODE or SYS"
                        ),
                    ));
                }
            }
        }
        for u in &self.unsupported {
            if u != "commonAncestor" && u != "nvlink" {
                return Err((
                    "topology.unsupported".into(),
                    format!("`{u}`: expected commonAncestor or nvlink"),
                ));
            }
        }
        Ok(())
    }
}
