// The kube-scheduler's DRA allocator (k8s.io/dynamic-resource-allocation/structured, the code
// the 1.37 scheduler links) run on what gpu-slicer publishes: ResourceSlices printed by
// `gpu-slicer dra slices` for a few sim nodes, the DeviceClasses of deploy/dra/ and the claim
// templates of deploy/dra/examples/. It prints one PASS/FAIL line per named check (which
// claims fit on which node, consumable capacity, counters, refusals) and, with -write-cases,
// a corpus of single-device cases with the allocator's answer for the API-server emulator's
// scheduler (src/testkit/apiserver/schedule.rs) to be held to (tests/allocator_cases.rs).
//
// Run by hack/allocator.sh. A module of its own: never part of the Rust workspace.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// features is what the 1.37 scheduler hands the allocator with its default feature gates
// (pkg/scheduler/framework/plugins/dynamicresources AllocatorFeatures over
// pkg/features/kube_features.go at v1.37.2): on are DRAAdminAccess (GA), DRAPrioritizedList
// (GA), DRADeviceTaints (GA), DRAConsumableCapacity (beta), DRAPartitionableDevices (beta),
// DRAFractionalCapacityRange (beta) and DRADeviceBindingConditions (beta) with
// DRAResourceClaimDeviceStatus (GA); off are the alpha gates DRAListTypeAttributes,
// DRAOptionalNodeOperations, DRADerivedAttributes and DRADeviceCompatibilityGroups.
var features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// celCache is the scheduler's own compiled-expression cache, with its compiler features.
var celCache = cel.NewCache(64, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

// world is what the scheduler sees: every node's slices, the classes, and claims already
// allocated (in the order they were).
type world struct {
	slices    []*resourceapi.ResourceSlice
	classes   classLister
	allocated []*resourceapi.ResourceClaim
}

// allocatedState builds the allocator's view of allocated claims the way the scheduler's
// dynamicresources plugin does (foreachAllocatedDevice): shared results by share ID and
// consumed capacity, other results as dedicated devices, admin access not counted.
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if r.ShareID != nil {
				state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
				if r.ConsumedCapacity != nil {
					state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
				}
				continue
			}
			state.AllocatedDevices.Insert(id)
		}
	}
	return state
}

// allocate runs the allocator for one claim on one node: the result, or nil when the
// claim does not fit there.
func (w *world) allocate(node string, claim *resourceapi.ResourceClaim) (*resourceapi.AllocationResult, error) {
	ctx := context.Background()
	alloc, err := structured.NewAllocator(ctx, features, allocatedState(w.allocated), w.classes, w.slices, celCache)
	if err != nil {
		return nil, err
	}
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"kubernetes.io/hostname": node}}}
	results, err := alloc.Allocate(ctx, n, []*resourceapi.ResourceClaim{claim})
	if err != nil {
		return nil, fmt.Errorf("claim %s on node %s: %w", claim.Name, node, err)
	}
	if len(results) == 0 {
		return nil, nil
	}
	return &results[0], nil
}

// commit records the claim as allocated, so later claims see it.
func (w *world) commit(claim *resourceapi.ResourceClaim, result *resourceapi.AllocationResult) {
	c := claim.DeepCopy()
	c.Status.Allocation = result
	w.allocated = append(w.allocated, c)
}

// readObjects reads every object of a multi-document YAML or JSON stream as raw JSON,
// unwrapping `kind: List`.
func readObjects(path string) ([]json.RawMessage, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []json.RawMessage
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
			continue
		}
		var head struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		if err := json.Unmarshal(raw, &head); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if head.Kind == "List" {
			out = append(out, head.Items...)
			continue
		}
		out = append(out, raw)
	}
}

func kindOf(raw json.RawMessage) string {
	var head struct {
		Kind string `json:"kind"`
	}
	_ = json.Unmarshal(raw, &head)
	return head.Kind
}

func strictDecode(raw json.RawMessage, into any, path string) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// loadSlices reads `dra slices` output; the slices of one node file.
func loadSlices(path string) ([]*resourceapi.ResourceSlice, error) {
	objs, err := readObjects(path)
	if err != nil {
		return nil, err
	}
	var out []*resourceapi.ResourceSlice
	for _, raw := range objs {
		if kindOf(raw) != "ResourceSlice" {
			continue
		}
		s := &resourceapi.ResourceSlice{}
		if err := strictDecode(raw, s, path); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no ResourceSlice in it", path)
	}
	return out, nil
}

func loadClasses(path string) (classLister, error) {
	objs, err := readObjects(path)
	if err != nil {
		return nil, err
	}
	out := classLister{}
	for _, raw := range objs {
		if kindOf(raw) != "DeviceClass" {
			continue
		}
		c := &resourceapi.DeviceClass{}
		if err := strictDecode(raw, c, path); err != nil {
			return nil, err
		}
		out[c.Name] = c
	}
	return out, nil
}

// example is one example workload: the claim its pod gets.
type example struct {
	file  string
	claim *resourceapi.ResourceClaim
}

// loadExamples reads the claim templates of the examples directory, and turns each pod that
// asks for an extended resource a class serves into the claim the scheduler makes for it
// (one ExactCount request of that class, named as the scheduler names it).
func loadExamples(dir string, classes classLister) ([]example, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var out []example
	for _, f := range files {
		objs, err := readObjects(f)
		if err != nil {
			return nil, err
		}
		for _, raw := range objs {
			switch kindOf(raw) {
			case "ResourceClaimTemplate":
				t := &resourceapi.ResourceClaimTemplate{}
				if err := strictDecode(raw, t, f); err != nil {
					return nil, err
				}
				out = append(out, example{file: filepath.Base(f), claim: newClaim(t.Name, t.Spec.Spec)})
			case "Pod":
				p := &v1.Pod{}
				if err := json.Unmarshal(raw, p); err != nil {
					return nil, fmt.Errorf("%s: %w", f, err)
				}
				if c := extendedClaim(p, classes); c != nil {
					out = append(out, example{file: filepath.Base(f), claim: c})
				}
			}
		}
	}
	return out, nil
}

func extendedClaim(p *v1.Pod, classes classLister) *resourceapi.ResourceClaim {
	for ci, ctr := range p.Spec.Containers {
		for name, q := range ctr.Resources.Limits {
			for _, c := range classes {
				if c.Spec.ExtendedResourceName == nil || *c.Spec.ExtendedResourceName != string(name) {
					continue
				}
				req := resourceapi.DeviceRequest{
					Name: fmt.Sprintf("container-%d-request-0", ci),
					Exactly: &resourceapi.ExactDeviceRequest{
						DeviceClassName: c.Name,
						AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
						Count:           q.Value(),
					},
				}
				return newClaim(p.Name+"-extended-resources", resourceapi.ResourceClaimSpec{
					Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}},
				})
			}
		}
	}
	return nil
}

var claimSeq int

// newClaim is the claim the API server stores for `spec`, with the defaults it fills in
// (allocationMode ExactCount, count 1): the allocator refuses a claim without them.
func newClaim(name string, spec resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
	claimSeq++
	spec = *spec.DeepCopy()
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			defaultMode(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			defaultMode(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: "gpu-demo",
			UID:       types.UID(fmt.Sprintf("c1a10000-0000-4000-8000-%012d", claimSeq)),
		},
		Spec: spec,
	}
}

// oneRequest is a claim of one ExactCount request of `class` with a CEL selector and
// capacity requests (name → quantity), or nil ones.
func oneRequest(name, class, selector string, capacity map[string]string) *resourceapi.ResourceClaim {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}
	if selector != "" {
		req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: selector}}}
	}
	if len(capacity) > 0 {
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for k, v := range capacity {
			req.Capacity.Requests[resourceapi.QualifiedName(k)] = resource.MustParse(v)
		}
	}
	return newClaim(name, resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
		Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}},
	}})
}

func devicesOf(r *resourceapi.AllocationResult) []string {
	var out []string
	for _, d := range r.Devices.Results {
		out = append(out, d.Device)
	}
	return out
}

type nodeFlags map[string]string

func (n nodeFlags) String() string { return fmt.Sprint(map[string]string(n)) }
func (n nodeFlags) Set(v string) error {
	name, path, ok := strings.Cut(v, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("want <node>=<slices file>, got %q", v)
	}
	n[name] = path
	return nil
}

func main() {
	nodes := nodeFlags{}
	flag.Var(nodes, "slices", "<node>=<file>: `gpu-slicer dra slices` output of that node (repeatable; the node names below are required)")
	classesPath := flag.String("classes", "deploy/dra/deviceclasses.yaml", "DeviceClasses")
	examplesDir := flag.String("examples", "deploy/dra/examples", "directory of the example claim templates and pods")
	writeCases := flag.String("write-cases", "", "also write the single-device case corpus (with the allocator's answers) to this file")
	flag.Parse()
	if err := run(nodes, *classesPath, *examplesDir, *writeCases); err != nil {
		fmt.Fprintln(os.Stderr, "allocator:", err)
		// A check that failed is a finding (1); unreadable input is the caller's error (2).
		if errors.Is(err, errChecksFailed) {
			os.Exit(1)
		}
		os.Exit(2)
	}
}

func defaultMode(mode *resourceapi.DeviceAllocationMode, count *int64) {
	if *mode == "" {
		*mode = resourceapi.DeviceAllocationModeExactCount
	}
	if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
		*count = 1
	}
}
