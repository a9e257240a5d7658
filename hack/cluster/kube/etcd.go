package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// runEtcd serves one etcd member on loopback until SIGTERM or SIGINT: the API server's
// store, nothing else. The Kubernetes release pins the etcd client; the server is the same
// release so the two never disagree on the wire.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dir := fs.String("data-dir", "", "etcd's data directory (required)")
	listen := fs.String("listen", "127.0.0.1:2379", "client address (loopback only)")
	peer := fs.String("listen-peer", "127.0.0.1:2380", "peer address (loopback only)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Dir = *dir
	cfg.Name = "cluster"
	cfg.LogLevel = "warn"
	client, err := url.Parse("http://" + *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen %q: %v\n", *listen, err)
		return 2
	}
	peerURL, err := url.Parse("http://" + *peer)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: --listen-peer %q: %v\n", *peer, err)
		return 2
	}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start in %s: %v\n", *dir, err)
		return 1
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready on %s\n", client)
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "etcd: not ready after 60s")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: %v, stopping\n", s)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		return 1
	}
}
