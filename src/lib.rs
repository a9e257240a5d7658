//! gpu-slicer: a node agent that hands out exactly the GPU share a workload asks for.
//!
//! Four layers, one direction of imports (each uses only the ones below it):
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
//! - MIG layouts as code: [`domain::miglayout`] (mig-parted files, selection, step planner),
//!   [`platform::mig`] (GPU/compute instances through NVML, rollback), [`runtime::miglayout`]
//!   (live repartitioning of idle GPUs), `gpu-slicer mig apply` in [`cli::mig`].
//! - Exit codes: [`cli::error`] (the one map, at the edge where every error is translated
//!   once; nothing below `cli` names it). Tests, demo, benches: [`testkit`] (kubelet
//!   emulator, fixtures). Generated kubelet APIs: [`proto`]. Fuzz targets: [`fuzz`] (one
//!   entry per target).

// DRAFT of the public façade (issue 19 item 1, phase 2; nothing below is in force yet). Once
// the other branches are merged, this crate's root becomes the façade and everything else
// `pub(crate)`, its modules private, `unreachable_pub` clean. What is reachable from outside
// and who needs it, 59 items counting modules (generated proto messages and clients not
// counted; methods and fields of the types not counted):
//
//   main()                the binary: src/main.rs is `gpu_slicer::main()`                 1
//   fuzz + 7 entries      cdi_spec, config_parse, event_line, kubelet_usage, mig_parted,
//                         node_file, oci_state_cgroup: one per cargo-fuzz target          8
//   proto + deviceplugin, podresources: the kubelet API the socket bench and the
//                         ListAndWatch flood test speak (HEALTHY: the string "Healthy")   3
//   testkit + 37, flat (its modules private), one `Error` for the whole kit             38
//     Node, Error         daemon + kubelet emulator in a temp dir. `Node::run(&[args])`
//                         starts the daemon from `gpu-slicer run` flags in-process, so no
//                         caller needs RunSettings (benches reload, scaling, health,
//                         plugin; any tests/ daemon that needs no child process)
//     KubeletEmulator, DeviceInfo, PodRef, Allocation, Registered
//     ApiServer, Verb, Fault, User, Denial, Admission, RequestRecord
//     DraPluginConn (`::register`), KubeletClaim                    (tests/dra_run.rs)
//     STEP, within, wait_until, temp_dir, percentile
//     fake_lib, PrivateFake, fake_driver_root, write_mig_minors
//     free_port, read_cdi_spec, socket_name, SHUTDOWN_DEADLINE
//     SHARED_CONFIG, write_pool_configs, cdi_must_reject, file_names
//     Manifests (what `kustomize` returns: object, strings), kustomize, node, until_labels
//     pub(crate), unit tests only: http, promtool_check, rerun_alone, spec_device_names,
//     time_sliced, file_loader, MIG_A100_40GB, labels_of, fixtures::{inventory, config,
//     plan, planned, store}, pod_uid, checkpoint_json (once bench::usage_* has them)
//   bench + 8             hot paths prepared, returned as closures to time                 9
//     cdi_spec(gpus, migs, shares, format) -> impl FnMut() -> usize        (cdi, scaling)
//     allocate(profile, config, resource) -> impl FnMut(&[String]) -> usize (plugin, socket)
//     preferred(node, config, resource) -> impl FnMut(&[String], usize) -> Vec<String>
//                                                                    (plugin, topology)
//     dra_slices(profile), dra_prepare(profile) -> impl FnMut() -> ...        (dra)
//     usage_attribution(gpus, slices), usage_sample(&PrivateFake) -> impl FnMut() (usage)
//     driver_discovery(root) -> impl FnMut()                                 (socket)
//
// Phase 2 must: make the layers private and clean `unreachable_pub`; move
// tests/dra_{kube,kubelet,publish}.rs into runtime::dra / platform::kube unit tests
// (dra_run.rs and dra_slices.rs drive the binary and stay, through testkit); move the
// benches onto `Node::run` and `bench` (benches/health.rs and socket.rs also drop their own
// copies of the fake-NVML loader for testkit::PrivateFake / fake_lib).

pub mod bench;
mod cli;
mod domain;
pub mod fuzz;
mod platform;
pub mod proto;
mod runtime;
mod state;
pub mod testkit;

/// The `gpu-slicer` binary: parse the command line, set up logging, run the command, and
/// map its error to the exit code (the one map, [`cli::error::Error::exit_code`]; the output
/// policy is [`cli::logging`]'s).
pub fn main() -> std::process::ExitCode {
    use clap::Parser;
    use cli::logging::{init_tracing, is_broken_pipe, report_fatal};

    let cli = cli::Cli::parse();
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
