// One multi-call binary for the local cluster tier (hack/cluster.sh): the Kubernetes
// control plane, the kubelet and an embedded etcd, chosen by the first argument. One binary
// instead of five because they share nearly every package: one link, one copy on disk.
//
//	kube etcd --data-dir D --listen 127.0.0.1:P
//	kube apiserver|controller-manager|scheduler|kubelet [their own flags]
//
// A module of its own under hack/ (never part of the Rust workspace); go.mod pins
// k8s.io/kubernetes and replaces every staging module with its published release
// (hack/cluster/sync-replaces.sh derives that list from k8s.io/kubernetes' go.mod).
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kube etcd|apiserver|controller-manager|scheduler|kubelet [flags]")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	var cmd *cobra.Command
	switch name {
	case "etcd":
		os.Exit(runEtcd(args))
	case "apiserver":
		cmd = apiserver.NewAPIServerCommand()
	case "controller-manager":
		cmd = controllermanager.NewControllerManagerCommand()
	case "scheduler":
		cmd = scheduler.NewSchedulerCommand()
	case "kubelet":
		cmd = kubelet.NewKubeletCommand(context.Background())
	default:
		fmt.Fprintf(os.Stderr, "kube: unknown component %q (etcd|apiserver|controller-manager|scheduler|kubelet)\n", name)
		os.Exit(2)
	}
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}
