//! Generated kubelet gRPC bindings (device plugin, pod resources, DRA, plugin registration,
//! DRA health), included once, plus the API constants.
//!
//! `build.rs` compiles `proto/` into `OUT_DIR`. Only `crate::runtime::plugin`, `crate::runtime::dra` and `crate::testkit::kubelet`
//! (the gRPC edges) use these types; domain code never sees prost names such as
//! `device_i_ds`.

/// Device plugin API v1beta1 (`Registration` and `DevicePlugin` services).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub mod deviceplugin {
    tonic::include_proto!("v1beta1");
    pub use super::frame::ListAndWatchResponse;
}

/// `v1beta1.ListAndWatchResponse` as bytes already encoded (`build.rs` maps the message
/// here with `extern_path`). A frame is the concatenation of its devices' encodings, so the
/// ListAndWatch stream can build one from per-device fragments it keeps, instead of
/// allocating three strings per device and encoding them again on every health change
/// (the cost of an XID's frame on a 512-replica resource). Decoding (the tests' and the
/// emulator's client side) keeps the same bytes; [`ListAndWatchResponse::devices`](frame::ListAndWatchResponse::devices) reads them.
pub mod frame {
    use std::sync::Arc;

    use prost::bytes::{Buf, BufMut};
    use prost::encoding::{DecodeContext, WireType};

    use super::deviceplugin::Device;

    /// Field number of `repeated Device devices` in `ListAndWatchResponse`.
    const DEVICES: u32 = 1;

    /// A ListAndWatch frame, encoded: its bytes (encoded at once, or kept as received), or
    /// one encoding per device picked from a table the stream keeps.
    #[derive(Clone, Default, Debug)]
    pub struct ListAndWatchResponse {
        encoded: Vec<u8>,
        /// When set, the frame is these picks and `encoded` is empty.
        picked: Option<Picked>,
    }

    /// A frame picked from a table of device encodings (healthy or unhealthy, or the
    /// device left out): written straight into the encoder's buffer, so a health change
    /// costs one pick per device and one copy of the bytes, and no frame-sized buffer.
    #[derive(Clone, Debug)]
    struct Picked {
        table: Arc<Vec<[Vec<u8>; 2]>>,
        picks: Vec<Pick>,
        len: usize,
    }

    impl Picked {
        fn write(&self, buf: &mut impl BufMut) {
            for (t, p) in self.table.iter().zip(&self.picks) {
                match p {
                    Pick::Healthy => buf.put_slice(&t[0]),
                    Pick::Unhealthy => buf.put_slice(&t[1]),
                    Pick::Left => {}
                }
            }
        }
    }

    /// Which of a device's encodings a frame carries.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum Pick {
        /// The first (healthy) encoding.
        Healthy,
        /// The second (unhealthy) encoding.
        Unhealthy,
        /// Not listed.
        Left,
    }

    impl PartialEq for ListAndWatchResponse {
        fn eq(&self, other: &Self) -> bool {
            self.bytes() == other.bytes()
        }
    }

    impl Eq for ListAndWatchResponse {}

    impl ListAndWatchResponse {
        /// The frame listing `devices`.
        pub fn from_devices<'a>(devices: impl IntoIterator<Item = &'a Device>) -> Self {
            let mut encoded = Vec::new();
            for d in devices {
                encoded.extend_from_slice(&fragment(d));
            }
            Self {
                encoded,
                picked: None,
            }
        }

        /// A frame picking, for each device of `table` (made by [`fragment`]: healthy,
        /// then unhealthy), the encoding `picks` names; `picks` runs parallel to `table`.
        pub(crate) fn picked(table: Arc<Vec<[Vec<u8>; 2]>>, picks: Vec<Pick>) -> Self {
            let len = table
                .iter()
                .zip(&picks)
                .map(|(t, p)| match p {
                    Pick::Healthy => t[0].len(),
                    Pick::Unhealthy => t[1].len(),
                    Pick::Left => 0,
                })
                .sum();
            Self {
                encoded: Vec::new(),
                picked: Some(Picked { table, picks, len }),
            }
        }

        /// The frame's bytes (its `devices` fields, in order).
        fn bytes(&self) -> std::borrow::Cow<'_, [u8]> {
            match &self.picked {
                None => std::borrow::Cow::Borrowed(&self.encoded),
                Some(p) => {
                    let mut out = Vec::with_capacity(p.len);
                    p.write(&mut out);
                    std::borrow::Cow::Owned(out)
                }
            }
        }

        /// The bytes to append received fields to (a picked frame is written out first).
        fn encoded_mut(&mut self) -> &mut Vec<u8> {
            if let Some(p) = self.picked.take() {
                p.write(&mut self.encoded);
            }
            &mut self.encoded
        }

        /// The devices the frame lists.
        ///
        /// # Errors
        /// When the bytes are not a valid frame (only frames decoded from a peer can be).
        pub fn devices(&self) -> Result<Vec<Device>, prost::DecodeError> {
            let bytes = self.bytes();
            let mut buf = &bytes[..];
            let mut out = Vec::new();
            while buf.has_remaining() {
                let (tag, wire_type) = prost::encoding::decode_key(&mut buf)?;
                debug_assert_eq!(tag, DEVICES);
                let mut device = Device::default();
                prost::encoding::message::merge(
                    wire_type,
                    &mut device,
                    &mut buf,
                    DecodeContext::default(),
                )?;
                out.push(device);
            }
            Ok(out)
        }
    }

    /// One device as it appears in a frame: field key, length, message.
    pub fn fragment(device: &Device) -> Vec<u8> {
        let mut buf = Vec::new();
        prost::encoding::message::encode(DEVICES, device, &mut buf);
        buf
    }

    impl prost::Message for ListAndWatchResponse {
        fn encode_raw(&self, buf: &mut impl BufMut) {
            match &self.picked {
                None => buf.put_slice(&self.encoded),
                Some(p) => p.write(buf),
            }
        }

        fn merge_field(
            &mut self,
            tag: u32,
            wire_type: WireType,
            buf: &mut impl Buf,
            ctx: DecodeContext,
        ) -> Result<(), prost::DecodeError> {
            if tag != DEVICES {
                return prost::encoding::skip_field(wire_type, tag, buf, ctx);
            }
            prost::encoding::check_wire_type(WireType::LengthDelimited, wire_type)?;
            // The device's bytes are kept as they came (length checked by skipping them);
            // `devices()` decodes them. A client receiving a 512-device frame then copies it
            // instead of decoding and encoding every device again.
            let chunk = buf.chunk();
            if chunk.len() == buf.remaining() {
                let mut rest = chunk;
                prost::encoding::skip_field(wire_type, tag, &mut rest, ctx)?;
                let used = chunk.len() - rest.len();
                let encoded = self.encoded_mut();
                prost::encoding::encode_key(DEVICES, wire_type, encoded);
                encoded.extend_from_slice(&chunk[..used]);
                buf.advance(used);
                return Ok(());
            }
            // A buffer in pieces: decoded to check it, then kept encoded.
            let mut device = Device::default();
            prost::encoding::message::merge(wire_type, &mut device, buf, ctx)?;
            prost::encoding::message::encode(DEVICES, &device, self.encoded_mut());
            Ok(())
        }

        fn encoded_len(&self) -> usize {
            self.picked.as_ref().map_or(self.encoded.len(), |p| p.len)
        }

        fn clear(&mut self) {
            self.encoded.clear();
            self.picked = None;
        }
    }
}

/// PodResources API v1 (`PodResourcesLister`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod podresources {
    tonic::include_proto!("v1");
}

/// Kubelet DRA plugin API v1 (`k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`, Kubernetes 1.34+).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod dra_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// Kubelet DRA plugin API v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod dra_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// The kubelet plugin watcher's registration API (`pluginregistration.Registration`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// DRA resource health, bare package `v1alpha1` (`v1alpha1.DRAResourceHealth`).
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod drahealth_v1alpha1 {
    tonic::include_proto!("v1alpha1");
}

/// DRA resource health, bare package `v1` (`v1.DRAResourceHealth`, 1.37), generated apart
/// from pod-resources v1 (same package name) by `build.rs`.
#[allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]
pub(crate) mod drahealth_v1 {
    include!(concat!(env!("OUT_DIR"), "/drahealth_v1/v1.rs"));
}

/// The API version string sent in `RegisterRequest.version`.
pub(crate) const VERSION: &str = "v1beta1";

/// Default device-plugin socket directory.
pub(crate) const DEFAULT_DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// File name of the kubelet's registration socket inside the device-plugin directory.
pub(crate) const KUBELET_SOCKET_NAME: &str = "kubelet.sock";

/// Health value of a usable device.
pub const HEALTHY: &str = "Healthy";

/// Health value of an unusable device.
pub(crate) const UNHEALTHY: &str = "Unhealthy";

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::deviceplugin::{Device, ListAndWatchResponse, NumaNode, TopologyInfo};

    /// The bytes a frame carries are protobuf's own encoding of `repeated Device devices = 1`
    /// (worked out by hand here, not with the code under test), and what a client decodes
    /// from them is what was sent; fields a newer kubelet API might add are skipped.
    #[test]
    fn frames_are_the_wire_message_and_decode_back() {
        let plain = Device {
            id: "a".into(),
            health: "Healthy".into(),
            topology: None,
        };
        let frame = ListAndWatchResponse::from_devices([&plain]);
        let mut expected = vec![0x0a, 12, 0x0a, 1, b'a', 0x12, 7];
        expected.extend_from_slice(b"Healthy");
        assert_eq!(frame.encode_to_vec(), expected);

        let numa = Device {
            id: "GPU-x::3".into(),
            health: "Unhealthy".into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 1 }],
            }),
        };
        let frame = ListAndWatchResponse::from_devices([&plain, &numa]);
        let mut wire = frame.encode_to_vec();
        // An unknown field 7 (varint 5) after the devices.
        wire.extend_from_slice(&[0x38, 5]);
        let decoded = ListAndWatchResponse::decode(wire.as_slice()).unwrap();
        assert_eq!(decoded.devices().unwrap(), vec![plain, numa]);
        assert_eq!(decoded, frame);
        assert!(ListAndWatchResponse::decode(&[0x0a, 40, 1][..]).is_err());
        // Field 1 as a varint is no device list.
        assert!(ListAndWatchResponse::decode(&[0x08, 1][..]).is_err());
        // A buffer in two pieces takes the decoding path and gives the same frame.
        let (a, b) = wire.split_at(5);
        let chained = prost::bytes::Buf::chain(a, b);
        assert_eq!(ListAndWatchResponse::decode(chained).unwrap(), frame);
    }

    /// A frame picked from a table of device encodings is, on the wire and decoded, the
    /// frame of the picked devices encoded one by one; a device left out is absent; and
    /// its length is what it writes.
    #[test]
    fn a_picked_frame_is_the_frame_of_its_picks() {
        use super::frame::{Pick, fragment};
        let device = |id: &str, health: &str| Device {
            id: id.into(),
            health: health.into(),
            topology: Some(TopologyInfo {
                nodes: vec![NumaNode { id: 0 }],
            }),
        };
        let ids = ["GPU-a::0", "GPU-a::1", "GPU-b::0"];
        let table: Vec<[Vec<u8>; 2]> = ids
            .iter()
            .map(|id| {
                [
                    fragment(&device(id, "Healthy")),
                    fragment(&device(id, "Unhealthy")),
                ]
            })
            .collect();
        let picked = ListAndWatchResponse::picked(
            std::sync::Arc::new(table),
            vec![Pick::Unhealthy, Pick::Left, Pick::Healthy],
        );
        let want = [device(ids[0], "Unhealthy"), device(ids[2], "Healthy")];
        let plain = ListAndWatchResponse::from_devices(&want);
        let wire = picked.encode_to_vec();
        assert_eq!(wire, plain.encode_to_vec());
        assert_eq!(picked.encoded_len(), wire.len());
        assert_eq!(picked.devices().unwrap(), want);
        assert_eq!(picked, plain);
        // Fields merged into a picked frame come after its picks.
        let mut merged = picked.clone();
        merged.merge(plain.encode_to_vec().as_slice()).unwrap();
        assert_eq!(merged.devices().unwrap().len(), 4);
    }
}
