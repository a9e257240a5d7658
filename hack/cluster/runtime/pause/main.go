// The sandbox ("pause") process of the local cluster's pods: holds the pod's namespaces,
// reaps orphans, and exits on SIGTERM or SIGINT. Built static and packed as the image that
// containerd's pinned sandbox reference names (hack/cluster/images.sh); no registry is
// reachable from the test machines.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
