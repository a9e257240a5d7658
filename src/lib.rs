//! gpu-slicer: a node agent that hands out exactly the GPU share a workload asks for.
//!
//! Five layers, one direction of imports (each uses only the ones below it):
//!
//! ```text
//! cli        clap types and one module per subcommand; arguments -> settings
//! runtime    actors on one TaskTracker, each stopped by a CancellationToken:
//!            supervisor (wiring, ordered shutdown), reloader (triggers -> load/discover
//!            -> transition -> spec -> commit), plugin servers, health monitor, MPS
//!            reconciler, ledger, metrics, HTTP
//! state      the store: one watch<Arc<Snapshot>>, commands that change it
//! domain     pure values and functions: config, inventory, plan, device nodes, CDI
//!            (model, generate, validate, YAML), views (resources with their
//!            health), allocate (rules, preferred, responses), MPS derivation, health policy, node labels, snapshot,
//!            transition::next
//! platform   the host: NVML (inventory, events, memory limits), sim backend, the
//!            user-space driver (discovery, hooks), files (spec writer, checkpoint)
//! ```
//!
//! Where each behaviour lives:
//! - Discovery: [`platform::nvml`], [`platform::sim`]; types in [`domain::inventory`].
//! - Config: [`domain::config`] (NVIDIA `version: v1` plus extensions, precedence).
//! - Planning: [`domain::plan`] (`Inventory × Config → Plan`).
//! - A reload, start included: [`runtime::reloader`] does the I/O around the pure
//!   [`domain::transition::next`], which computes the next [`state::Snapshot`], the CDI spec
//!   (every held device kept), the per-resource diff and the MPS changes.
//! - What is served: [`state::Store`]; every RPC reads one snapshot.
//! - The kubelet API: [`runtime::plugin`] (one server per resource, registration,
//!   ListAndWatch streams without a task each, Allocate with its generation).
//! - Enforcement: [`domain::allocate`] (rules, responses), [`domain::cdi::shares`] (share
//!   devices), [`platform::enforce`] (the memory-limit hook), [`runtime::mps`] (daemons).
//! - The driver in the spec: [`platform::driver`] (discovery, ld.so.cache, in-root paths,
//!   `cdi-hook` driver hooks).
//! - Health: [`runtime::health`] (sources) over [`domain::health`] (policy).
//! - Operations: [`runtime::ledger`] (PodResources), [`runtime::metrics`], [`runtime::http`].
//! - Node labels: [`domain::labels`] (GPU Feature Discovery's names, pure), kept in an NFD
//!   feature file by [`runtime::labels`] through [`platform::labels_file`].
//! - Usage: [`runtime::usage`] (the sampler thread) over [`platform::usage`] (NVML / sim
//!   figures, cgroup and kubelet checkpoint readers) and [`domain::usage`] (attribution,
//!   idle window, placeable requests); `gpu-slicer top` in [`cli::top`].
//! - Held devices across restarts: [`platform::checkpoint`].
//! - DRA: [`domain::dra`] (ResourceSlices, DeviceClasses, opaque config, claim resolution,
//!   per-claim CDI specs), [`runtime::dra`] (registration, DRAPlugin v1/v1beta1, health
//!   stream) over [`platform::dra_state`] (checkpoint, claim specs); `gpu-slicer dra slices`
//!   in [`cli::dra`].
//! - Advise: [`domain::advise`] (usage export, workloads and classes, shares, packing, the
//!   plan as code, summary and HTML report, the PromQL), [`platform::prometheus`] (the HTTP
//!   API client), `gpu-slicer advise` in [`cli::advise`].
//! - MIG layouts as code: [`domain::miglayout`] (mig-parted files, selection, step planner),
//!   [`platform::mig`] (GPU/compute instances through NVML, rollback), [`runtime::miglayout`]
//!   (live repartitioning of idle GPUs), `gpu-slicer mig apply` in [`cli::mig`].
//! - Exit codes: [`cli::error`] (the one map, at the edge where every error is translated
//!   once; nothing below `cli` names it). Tests, demo, benches: [`testkit`] (kubelet
//!   emulator, fixtures). Generated kubelet APIs: [`proto`]. Fuzz targets: [`fuzz`] (one
//!   entry per target).
//!
//! # The public façade
//!
//! The layers above are private modules; nothing in them is `pub` but the four items the
//! façade re-exports (`testkit::{ContainerAllocation, socket_name, SHUTDOWN_DEADLINE}`,
//! `bench::Format`), `ContainerAllocation::cdi_devices` and `testkit::Node::run`, written in
//! `cli::run`. What is reachable from outside the crate is what the binary, the
//! integration tests (`tests/`), the benches (`benches/`) and the fuzz targets (`fuzz/`)
//! use, and nothing else (`unreachable_pub` is clean): **71 items**, counting the four
//! modules and every type a public signature names (the generated proto messages and
//! clients, and methods and fields, not counted).
//!
//! | item | who needs it | count |
//! |---|---|---|
//! | [`main`] | the binary: `src/main.rs` is `gpu_slicer::main()` | 1 |
//! | [`fuzz`] + `cdi_spec`, `config_parse`, `event_line`, `kubelet_usage`, `mig_parted`, `node_file`, `oci_state_cgroup` | one per cargo-fuzz target (`fuzz/fuzz_targets/<name>.rs`) | 8 |
//! | [`proto`] + `deviceplugin`, `HEALTHY` | the kubelet's device-plugin API: bench `socket` (a client of its own), test `http_flood` | 3 |
//! | [`bench`](mod@bench) + 12 | the benches' in-process hot paths (`Served`, `cdi_spec` with `Format`, `nvml_discovery`, `driver_discovery`, `dra_slices`, `DraPrepare`, `DraDriver`, `Usage`, `advise_fleet`, `advise_pack` with `AdvisePacking`; which bench uses which: its doc) | 13 |
//! | [`testkit`] + 45 | tests and benches, flat names (its modules are private): | 46 |
//!
//! The testkit's 45, by what they serve:
//! - a node: `Node` (`Node::run`: the daemon from `gpu-slicer run` flags, in process, with
//!   the kubelet emulator), `NodeError` (benches `health`, `plugin`, `reload`, `scaling`);
//!   `STEP`, `within`, `wait_until`, `temp_dir` (the tests, through `tests/common`);
//! - the kubelet emulator: `KubeletEmulator`, `DeviceInfo`, `Allocation`,
//!   `ContainerAllocation`, `Registered`, `EmulatorError`, `socket_name`,
//!   `SHUTDOWN_DEADLINE` (tests of a daemon in a child process, bench `health`);
//! - the DRA kubelet side: `DraPluginConn`, `KubeletClaim`, `DraVersion`, `DraKubeletError`
//!   (tests `dra_run`, `dra_capacity`, bench `dra`);
//! - the API-server emulator: `ApiServer`, `ApiServerError`, `Verb`, `Fault`, `User`,
//!   `Admission`, `Denial`, `RequestRecord`, `ShareRequest`, `ShareAllocated` (tests
//!   `kube_apiserver`, `label_policy`, `dra_*`, `allocator_cases`, `cli_fleet`, bench `dra`);
//! - the fake NVML driver: `fake_lib`, `fake_driver_root`, `write_mig_minors`,
//!   `PrivateFake` (the tests through `tests/common`, benches `health`, `socket`,
//!   `topology`);
//! - `deploy/` and Kubernetes objects: `kustomize`, `object`, `strings`, `node`,
//!   `until_labels` (tests `deploy_args`, `kube_apiserver`, `cli_fleet`);
//! - fixtures and readers: `SHARED_CONFIG`, `write_pool_configs`, `cdi_must_reject`,
//!   `file_names`, `read_cdi_spec`, `spec_device_names`, `free_port`, `percentile` (the
//!   benches' one percentile).
//!
//! The types a public method returns are named too (`Allocation`, `Registered`,
//! `ContainerAllocation`, the four error types, ...), so that no reachable type is
//! unnameable. What only unit tests use stays `pub(crate)` or `#[cfg(test)]`.
//!
//! # Features
//!
//! - `agent` (default): everything but the pure core; without it the library is
//!   [`fuzz`] over the domain and the platform readers it reaches (what `fuzz/` builds).
//! - `testkit`: [`bench`](mod@bench) and the test kit beyond what `gpu-slicer demo` runs
//!   (the kubelet emulator's device-plugin and PodResources sides and `Node` are always
//!   built), and the hidden `emulate` command. Off in a plain or release build; the crate's
//!   dev-dependency on itself turns it on for unit tests, `tests/` and `benches/`.

// Without the `agent` feature (the fuzz build) the library is the domain, the platform
// readers the fuzz targets reach and `fuzz`: most of the domain is then unused, which is
// expected and not worth a warning per item.
#![cfg_attr(
    not(feature = "agent"),
    allow(dead_code, unused_imports, unreachable_pub)
)]

#[cfg(feature = "testkit")]
pub mod bench;
#[cfg(feature = "agent")]
mod cli;
mod domain;
pub mod fuzz;
mod platform;
#[cfg(feature = "agent")]
pub mod proto;
#[cfg(feature = "agent")]
mod runtime;
#[cfg(feature = "agent")]
mod state;
#[cfg(feature = "agent")]
pub mod testkit;

/// The `gpu-slicer` binary: parse the command line, set up logging, run the command, and
/// map its error to the exit code (the one map, [`cli::error::Error::exit_code`]; the output
/// policy is [`cli::logging`]'s).
#[cfg(feature = "agent")]
pub fn main() -> std::process::ExitCode {
    use cli::logging::{init_tracing, is_broken_pipe, report_fatal};

    let cli = cli::parse();
    init_tracing(cli.log_format, cli.default_log_filter());
    match cli::dispatch(&cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `gpu-slicer inventory | head`: the reader left, nothing went wrong.
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            report_fatal(cli.log_format, &e);
            e.exit_code()
        }
    }
}
