// Command kubelet-dial reaches gpu-slicer's DRA sockets the way the kubelet does, with the
// kubelet's own client code (grpc-go and the generated k8s.io/kubelet APIs): the registration
// socket dialled with its bare path and a unix context dialer (what the plugin watcher does, so
// grpc-go sends the path as the HTTP/2 :authority), GetInfo checked, NotifyRegistrationStatus
// sent, then the endpoint GetInfo named dialled the same way for NodePrepareResources and
// NodeUnprepareResources of one claim (-keep: prepare only). One line per step on stdout; exit 1 on the first failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func dial(ctx context.Context, path string) (*grpc.ClientConn, error) {
	// A bare path and the passthrough resolver: the :authority is the path itself.
	//nolint:staticcheck // DialContext is what the plugin watcher calls.
	return grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
}

func fail(step string, err error) {
	fmt.Printf("FAIL %s: %v\n", step, err)
	os.Exit(1)
}

func main() {
	reg := flag.String("registration", "", "the plugin's registration socket")
	ns := flag.String("namespace", "", "claim namespace (no claim: registration only)")
	name := flag.String("name", "", "claim name")
	uid := flag.String("uid", "", "claim UID")
	keep := flag.Bool("keep", false, "leave the claim prepared (no NodeUnprepareResources)")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	conn, err := dial(ctx, *reg)
	if err != nil {
		fail("dial registration", err)
	}
	defer conn.Close()
	registration := registerapi.NewRegistrationClient(conn)
	info, err := registration.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		fail("GetInfo", err)
	}
	if info.Type != registerapi.DRAPlugin || !slices.Contains(info.SupportedVersions, "v1.DRAPlugin") {
		fail("GetInfo", fmt.Errorf("type %q versions %v", info.Type, info.SupportedVersions))
	}
	fmt.Printf("ok GetInfo type=%s name=%s endpoint=%s versions=%s\n", info.Type, info.Name, info.Endpoint, strings.Join(info.SupportedVersions, ","))
	if _, err := registration.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		fail("NotifyRegistrationStatus", err)
	}
	fmt.Println("ok NotifyRegistrationStatus")
	if *uid == "" {
		return
	}

	svc, err := dial(ctx, info.Endpoint)
	if err != nil {
		fail("dial endpoint", err)
	}
	defer svc.Close()
	dra := drapb.NewDRAPluginClient(svc)
	claim := &drapb.Claim{Namespace: *ns, Name: *name, Uid: *uid}
	prepared, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{claim}})
	if err != nil {
		fail("NodePrepareResources", err)
	}
	answer, found := prepared.Claims[*uid]
	if !found || answer.Error != "" || len(answer.Devices) == 0 {
		fail("NodePrepareResources", fmt.Errorf("answer %v", answer))
	}
	for _, d := range answer.Devices {
		fmt.Printf("ok NodePrepareResources pool=%s device=%s cdi=%s\n", d.PoolName, d.DeviceName, strings.Join(d.CdiDeviceIds, ","))
	}
	if *keep {
		return
	}
	unprepared, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{claim}})
	if err != nil {
		fail("NodeUnprepareResources", err)
	}
	if got, found := unprepared.Claims[*uid]; !found || got.Error != "" {
		fail("NodeUnprepareResources", fmt.Errorf("answer %v", got))
	}
	fmt.Println("ok NodeUnprepareResources")
}
