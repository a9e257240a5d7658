//! gpu-slicer
