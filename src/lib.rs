//! gpu-slicer: a node agent that hands out exactly the GPU share a workload asks for.
//!
//! Data flows one way:
//!
//! ```text
//! backend (sim | NVML) -> inventory --+
//!                                     +--> plan --> CDI spec (cdi)
//! config file ------------------------+      \--> one device-plugin server per resource
//! ```
//!
//! Module map:
//! - [`inventory`]: domain types for GPUs and MIG devices; the `Backend` trait; sim backend.
//! - [`config`]: NVIDIA `version: v1` config plus extensions; load, validate, precedence.
//! - [`plan`]: pure `Inventory × Config → Plan` (resources and allocatable devices).
//! - [`cdi`]: CDI spec model, pure `Inventory → Spec` generator, checks, atomic writer.
//! - [`enforce`]: per-container GPU memory limits (the `cdi-hook set-memory-limit` command).
//! - [`mps`]: MPS control daemons per shared device (derivation, supervision, client edits).
//! - [`cli`]: command-line surface; [`commands`] runs each subcommand.
//! - [`allocate`]: pure enforcement rules, preferred-allocation policies, responses, live health.
//! - [`health`]: NVML event thread / sim injector → XID policy with recovery → live health.
//! - [`plugin`]: one device-plugin gRPC server per resource, registration, kubelet watch.
//! - [`kubelet`]: in-process kubelet emulator (registration, device manager, PodResources).
//! - [`ledger`]: PodResources client: who holds which device, drift; [`metrics`] and
//!   [`http`]: Prometheus registry and the `/metrics` `/healthz` `/readyz` endpoint.
//! - [`app`]: the daemon's wiring, reloads and ordered shutdown; [`proto`]: generated kubelet APIs.
//! - [`reload`]: reload triggers (config directory watch, SIGHUP, re-scan timer).

pub mod cli;
pub mod domain;
pub mod error;
pub mod platform;
pub mod proto;
pub mod runtime;
pub mod state;
pub mod testkit;
