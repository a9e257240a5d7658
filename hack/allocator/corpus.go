// The case corpus (-write-cases): one device (the h100 node's shared gpu-0, as `dra slices`
// prints it, or a variant of it), claims already allocated on it, and one claim, with what
// the real allocator does with that claim. tests/allocator_cases.rs holds the API-server
// emulator's scheduler (src/testkit/apiserver/schedule.rs) to the same answers.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

type caseResult struct {
	Device           string            `json:"device"`
	Shared           bool              `json:"shared"`
	ConsumedCapacity map[string]int64  `json:"consumedMilli,omitempty"`
	ConsumedText     map[string]string `json:"consumedCapacity,omitempty"`
}

type caseExpect struct {
	Allocated bool         `json:"allocated"`
	Results   []caseResult `json:"results,omitempty"`
}

type allocCase struct {
	Name      string                       `json:"name"`
	About     string                       `json:"about"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Allocated []*resourceapi.ResourceClaim `json:"allocated"`
	Claim     *resourceapi.ResourceClaim   `json:"claim"`
	Device    string                       `json:"device"`
	Expect    caseExpect                   `json:"expect"`
}

type corpusFile struct {
	About string      `json:"about"`
	Cases []allocCase `json:"cases"`
}

// spec of one case: how the device differs from gpu-0, what was allocated before, what the
// claim asks.
type caseSpec struct {
	name, about string
	device      func(d *resourceapi.Device)
	before      []map[string]string
	// heldWhole: a result without a shareID already holds the device (as a scheduler
	// without consumable capacity writes it).
	heldWhole   bool
	ask         map[string]string
	tolerations []resourceapi.DeviceToleration
}

func q(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }

func exclusive(d *resourceapi.Device) { d.AllowMultipleAllocations = nil }

func caseSpecs(memory resource.Quantity) []caseSpec {
	free := memory.DeepCopy()
	free.Sub(resource.MustParse("20Gi"))
	over := free.DeepCopy()
	over.Add(resource.MustParse("2Mi"))
	freeSteps := stepDown(free, resource.MustParse("2Mi"))
	aboveAll := memory.DeepCopy()
	aboveAll.Add(resource.MustParse("2Mi"))
	tenGi := map[string]string{"memory": "10Gi"}
	return []caseSpec{
		{name: "share-10gi-25pct", about: "amounts as asked", ask: map[string]string{"memory": "10Gi", "compute": "25"}},
		{name: "share-nothing-asked", about: "each capacity's requestPolicy default"},
		{name: "share-memory-only", about: "compute from its default", ask: tenGi},
		{name: "share-rounded-up-to-step", about: "10Gi + 1 byte rounds up to the next 2Mi step", ask: map[string]string{"memory": "10737418241"}},
		{name: "share-below-min", about: "1Mi raised to validRange.min", ask: map[string]string{"memory": "1Mi"}},
		{name: "share-above-max-refused", about: "above validRange.max (the whole device)", ask: map[string]string{"memory": aboveAll.String()}},
		{name: "share-unpublished-capacity-refused", about: "a capacity the device does not publish rules it out", ask: map[string]string{"memory": "10Gi", "encoders": "1"}},
		{name: "third-share-above-free-refused", about: "two 10Gi shares held, 2Mi more than is left asked", before: []map[string]string{tenGi, tenGi}, ask: map[string]string{"memory": over.String()}},
		{name: "third-share-of-odd-free-refused", about: "two 10Gi shares held, exactly what is left (an odd number of MiB) asked: it rounds up to the 2Mi step past it", before: []map[string]string{tenGi, tenGi}, ask: map[string]string{"memory": free.String()}},
		{name: "third-share-of-the-free-steps", about: "two 10Gi shares held, what is left rounded down to the step asked", before: []map[string]string{tenGi, tenGi}, ask: map[string]string{"memory": freeSteps.String()}},
		{name: "compute-over-refused", about: "60 of 100 compute held, 50 asked", before: []map[string]string{{"memory": "2Mi", "compute": "60"}}, ask: map[string]string{"memory": "2Mi", "compute": "50"}},
		{name: "share-after-a-default-share-refused", about: "a share that asked nothing took the whole memory", before: []map[string]string{nil}, ask: map[string]string{"memory": "2Mi"}},
		{name: "valid-values-rounded-up", about: "compute with validValues 10/50/100: 30 becomes 50",
			device: validValues, ask: map[string]string{"memory": "2Mi", "compute": "30"}},
		{name: "valid-values-above-refused", about: "compute with validValues 10/50/100: 150 fits none",
			device: validValues, ask: map[string]string{"memory": "2Mi", "compute": "150"}},
		{name: "milli-step", about: "a capacity in milli units: 250m rounds up to 300m",
			device: milliCapacity, ask: map[string]string{"memory": "2Mi", "fraction": "250m"}},
		{name: "milli-default", about: "a capacity in milli units, nothing asked: its default 500m",
			device: milliCapacity, ask: map[string]string{"memory": "2Mi"}},
		{name: "no-policy-as-asked", about: "memory without requestPolicy: taken as asked, not rounded",
			device: noMemoryPolicy, ask: map[string]string{"memory": "10737418241"}},
		{name: "no-policy-nothing-asked", about: "memory without requestPolicy, nothing asked: the whole value",
			device: noMemoryPolicy, ask: map[string]string{"compute": "10"}},
		{name: "default-not-range-checked", about: "compute default 7 on a step of 5 from 0: taken as it is",
			device: offStepDefault, ask: map[string]string{"memory": "2Mi"}},
		{name: "tainted-refused", about: "a NoSchedule taint the claim does not tolerate",
			device: tainted, ask: tenGi},
		{name: "tainted-tolerated", about: "the same taint, tolerated", device: tainted, ask: tenGi,
			tolerations: []resourceapi.DeviceToleration{{Key: "gpu-slicer.io/xid", Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
		{name: "taint-equal-other-value-refused", about: "tolerated by key with operator Equal, but for another value", device: tainted, ask: tenGi,
			tolerations: []resourceapi.DeviceToleration{{Key: "gpu-slicer.io/xid", Operator: resourceapi.DeviceTolerationOpEqual, Value: "48"}}},
		{name: "taint-equal-same-value-tolerated", about: "tolerated by key and value, any effect", device: tainted, ask: tenGi,
			tolerations: []resourceapi.DeviceToleration{{Key: "gpu-slicer.io/xid", Operator: resourceapi.DeviceTolerationOpEqual, Value: "79"}}},
		{name: "taint-noexecute-refused", about: "a NoExecute taint rules the device out too", ask: tenGi,
			device: func(d *resourceapi.Device) {
				d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: "gpu-slicer.io/gpu-lost", Effect: resourceapi.DeviceTaintEffectNoExecute})
			}},
		{name: "exclusive-whole", about: "a device without allowMultipleAllocations is taken whole: no shareID, no consumedCapacity",
			device: exclusive},
		{name: "exclusive-capacity-asked", about: "an exclusive device with the capacity asked for: taken whole",
			device: exclusive, ask: tenGi},
		{name: "exclusive-capacity-above-refused", about: "an exclusive device asked for more than it has",
			device: exclusive, ask: map[string]string{"memory": aboveAll.String()}},
		{name: "exclusive-taken-once", about: "an exclusive device already allocated",
			device: exclusive, before: []map[string]string{nil}},
		{name: "shared-device-held-whole-refused", about: "a result without a shareID holds the shared device whole",
			heldWhole: true, ask: map[string]string{"memory": "2Mi"}},
	}
}

func validValues(d *resourceapi.Device) {
	c := d.Capacity["compute"]
	c.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: q("100"), ValidValues: []resource.Quantity{resource.MustParse("10"), resource.MustParse("50"), resource.MustParse("100")}}
	d.Capacity["compute"] = c
}

func milliCapacity(d *resourceapi.Device) {
	d.Capacity["fraction"] = resourceapi.DeviceCapacity{Value: resource.MustParse("2"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default: q("500m"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("100m"), Max: q("2"), Step: q("100m")}}}
}

func noMemoryPolicy(d *resourceapi.Device) {
	c := d.Capacity["memory"]
	c.RequestPolicy = nil
	d.Capacity["memory"] = c
}

func offStepDefault(d *resourceapi.Device) {
	c := d.Capacity["compute"]
	c.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: q("7"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("0"), Max: q("100"), Step: q("5")}}
	d.Capacity["compute"] = c
}

func tainted(d *resourceapi.Device) {
	d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: "gpu-slicer.io/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule})
}

func shareClaim(name string, ask map[string]string, tolerations []resourceapi.DeviceToleration) *resourceapi.ResourceClaim {
	c := oneRequest(name, "gpu.gpu-slicer.io", "", ask)
	c.Spec.Devices.Requests[0].Exactly.Tolerations = tolerations
	return c
}

func writeCorpus(path string, h100Slices []*resourceapi.ResourceSlice, classes classLister) (int, error) {
	var base *resourceapi.ResourceSlice
	var device resourceapi.Device
	for _, s := range h100Slices {
		for _, d := range s.Spec.Devices {
			if d.Name == "gpu-0" {
				base, device = s, d
			}
		}
	}
	if base == nil || device.AllowMultipleAllocations == nil || !*device.AllowMultipleAllocations {
		return 0, fmt.Errorf("the h100 node's slices have no shared gpu-0 (sharing config not applied?)")
	}
	var out corpusFile
	out.About = "Generated by hack/allocator (go run . -write-cases): each case's expect is what k8s.io/dynamic-resource-allocation/structured v0.37.2 with the 1.37 scheduler's features does with the claim; tests/allocator_cases.rs holds src/testkit/apiserver/schedule.rs to it. Do not edit by hand."
	for _, spec := range caseSpecs(device.Capacity["memory"].Value) {
		d := *device.DeepCopy()
		if spec.device != nil {
			spec.device(&d)
		}
		slice := base.DeepCopy()
		slice.Name = "h100-gpu-slicer.io-0"
		slice.Spec.Devices = []resourceapi.Device{d}
		slice.Spec.Pool.ResourceSliceCount = 1
		slice.Spec.SharedCounters = nil
		w := &world{slices: []*resourceapi.ResourceSlice{slice}, classes: classes}
		c := allocCase{Name: spec.name, About: spec.about, Slices: w.slices, Device: d.Name, Allocated: []*resourceapi.ResourceClaim{}}
		for i, ask := range spec.before {
			claim := shareClaim(fmt.Sprintf("before-%d", i), ask, nil)
			res, err := w.allocate(h100, claim)
			if err != nil || res == nil {
				return 0, fmt.Errorf("case %s: earlier claim %d refused (%v)", spec.name, i, err)
			}
			w.commit(claim, res)
		}
		if spec.heldWhole {
			claim := shareClaim("held-whole", nil, nil)
			w.commit(claim, &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: slice.Spec.Driver, Pool: slice.Spec.Pool.Name, Device: d.Name}}}})
		}
		for i, a := range w.allocated {
			// Share IDs are random; the corpus stays the same from run to run.
			for j := range a.Status.Allocation.Devices.Results {
				if a.Status.Allocation.Devices.Results[j].ShareID != nil {
					a.Status.Allocation.Devices.Results[j].ShareID = ptr.To(types.UID(fmt.Sprintf("5a4e0000-0000-4000-8000-%012d", i)))
				}
			}
		}
		c.Allocated = append(c.Allocated, w.allocated...)
		c.Claim = shareClaim("claim", spec.ask, spec.tolerations)
		res, err := w.allocate(h100, c.Claim)
		if err != nil {
			return 0, fmt.Errorf("case %s: %w", spec.name, err)
		}
		if res != nil {
			c.Expect.Allocated = true
			for _, r := range res.Devices.Results {
				cr := caseResult{Device: r.Device, Shared: r.ShareID != nil}
				if len(r.ConsumedCapacity) > 0 {
					cr.ConsumedCapacity = map[string]int64{}
					cr.ConsumedText = map[string]string{}
					for k, v := range r.ConsumedCapacity {
						cr.ConsumedCapacity[string(k)] = v.MilliValue()
						cr.ConsumedText[string(k)] = v.String()
					}
				}
				c.Expect.Results = append(c.Expect.Results, cr)
			}
		}
		out.Cases = append(out.Cases, c)
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return 0, err
	}
	return len(out.Cases), os.WriteFile(path, append(data, '\n'), 0o644)
}
