//! The `gpu-slicer` binary; all of it is the library's [`gpu_slicer::main`].

fn main() -> std::process::ExitCode {
    gpu_slicer::main()
}
