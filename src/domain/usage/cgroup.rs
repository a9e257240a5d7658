//! Which pod (and container) a process belongs to, from its `/proc/<pid>/cgroup` text:
//! systemd and cgroupfs drivers, cgroup v1 and v2. Pure; the usage sampler reads the files.

/// The pod (and container) a cgroup path belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PodCgroup {
    /// Pod UID with dashes (`5f1c…-…`), as the kubelet's checkpoint writes it.
    pub(crate) pod_uid: String,
    /// Container ID (runtime prefix stripped), when the path goes down to the container.
    pub(crate) container_id: Option<String>,
}

fn is_uid(s: &str) -> bool {
    (8..=64).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

fn is_container_id(s: &str) -> bool {
    (12..=128).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The pod UID a path segment names: systemd `kubepods[-<qos>]-pod<uid_with_underscores>.slice`
/// or cgroupfs `pod<uid>` (below a `kubepods` segment).
fn pod_segment(seg: &str, below_kubepods: bool) -> Option<String> {
    if let Some(slice) = seg.strip_suffix(".slice") {
        if !slice.starts_with("kubepods") {
            return None;
        }
        let (_, uid) = slice.rsplit_once("-pod")?;
        let uid = uid.replace('_', "-");
        return is_uid(&uid).then_some(uid);
    }
    let uid = seg.strip_prefix("pod")?;
    (below_kubepods && is_uid(uid)).then(|| uid.to_string())
}

/// The container ID a segment below the pod names: systemd `<runtime>-<id>.scope`
/// (`cri-containerd-`, `crio-`, `docker-`) or cgroupfs `<id>`. CRI-O's `crio-conmon-<id>`
/// is the monitor, not the container.
fn container_segment(seg: &str) -> Option<String> {
    let id = match seg.strip_suffix(".scope") {
        Some(scope) => {
            if scope.contains("conmon") {
                return None;
            }
            scope.rsplit_once('-').map_or(scope, |(_, id)| id)
        }
        None => seg,
    };
    is_container_id(id).then(|| id.to_string())
}

fn parse_cgroup_path(path: &str) -> Option<PodCgroup> {
    let mut below_kubepods = false;
    let mut segments = path.split('/').filter(|s| !s.is_empty());
    for seg in segments.by_ref() {
        if let Some(pod_uid) = pod_segment(seg, below_kubepods) {
            let container_id = segments.next().and_then(container_segment);
            return Some(PodCgroup {
                pod_uid,
                container_id,
            });
        }
        below_kubepods |= seg == "kubepods" || seg.starts_with("kubepods");
    }
    None
}

/// Parse `/proc/<pid>/cgroup` (v2 `0::<path>`, or v1's one line per hierarchy
/// `<id>:<controllers>:<path>`) into the pod it belongs to. The first line that names a pod
/// and a container wins, else the first that names a pod; `None`: not a pod's process.
pub(crate) fn parse_cgroup(text: &str) -> Option<PodCgroup> {
    let mut pod_only = None;
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        match parse_cgroup_path(path) {
            Some(p) if p.container_id.is_some() => return Some(p),
            Some(p) => {
                pod_only.get_or_insert(p);
            }
            None => {}
        }
    }
    pod_only
}
