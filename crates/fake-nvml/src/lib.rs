//! Placeholder: filled by the NVML issue.
