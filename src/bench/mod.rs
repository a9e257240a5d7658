//! The hot paths `benches/` times in process, prepared here so that the benches need no
//! internals: each function or constructor does the set-up (node, config, plan, store, fake
//! driver, files) once and hands back what one timed call runs, a closure or a method; the
//! bench keeps the clock, the loop and the figures it prints.
//!
//! - Allocate, GetPreferredAllocation and the node's CDI spec of a served node: [`Served`]
//!   (benches `plugin`, `socket`, `topology`, `scaling`);
//! - CDI spec generation of synthetic A100 nodes: [`cdi_spec`] (bench `cdi`);
//! - discovery through NVML on the fake library and of the host's user-space driver:
//!   [`nvml_discovery`], [`driver_discovery`] (benches `health`, `topology`, `socket`);
//! - the DRA driver: ResourceSlices ([`dra_slices`]), NodePrepareResources without the API
//!   ([`DraPrepare`]) and through the kubelet's socket ([`DraDriver`]) (bench `dra`), and
//!   under a kubelet's load: batches, concurrent clients, slow claim reads ([`DraClaims`],
//!   bench `dra_claims`);
//! - a usage round as the sampler runs it: [`Usage`] (bench `usage`);
//! - `advise` on a synthetic fleet: [`advise_fleet`] (the export), [`advise_pack`] (the pure
//!   advice timed, [`AdvisePacking`]) (bench `advise`, test `cli_advise`).
//!
//! Where what a call makes is large (a spec, an inventory, slices), the call reads the clock
//! itself and returns the time with the figures the bench prints, so that freeing it stays
//! outside the figure as it always was. Set-up failures panic: this is bench support, like
//! [`crate::testkit`].

mod advise;
mod cdi;
mod discovery;
mod dra;
mod dra_claims;
mod served;
mod usage;

pub use advise::{AdvisePacking, advise_fleet, advise_pack};
pub use cdi::cdi_spec;
pub use discovery::{driver_discovery, nvml_discovery};
pub use dra::{DraDriver, DraPrepare, dra_slices};
pub use dra_claims::DraClaims;
pub use served::Served;
pub use usage::Usage;

/// CDI spec encodings ([`cdi_spec`], [`Served::cdi_spec`]).
pub use crate::domain::cdi::Format;
