//! MPS control daemons at run time: one supervised `nvidia-cuda-mps-control` per shared
//! device ([`daemon`]) and their health fed into the device state ([`health`]). What the
//! daemons are is derived in [`crate::domain::mps`].

pub(crate) mod daemon;
pub(crate) mod health;

#[cfg(test)]
mod mps_tests;
