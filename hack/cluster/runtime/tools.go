//go:build tools

// The container runtime of the local cluster (hack/cluster.sh), pinned here and built by
// hack/cluster/build.sh: containerd with its runc shim and ctr, runc, and the CNI plugins
// bridge, host-local and loopback. A module apart from hack/cluster/kube so containerd's
// dependencies never unify with Kubernetes'.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/opencontainers/runc"
)
