// The named checks hack/allocator.sh reports: each prints PASS or FAIL with its reason.
package main

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Nodes hack/allocator.sh publishes (see its header for the configs):
//   - h100: dgx-h100, GPU 0 shared (timeSlicing, isolation memory), GPUs 1-7 whole;
//   - a100: mixed-a100 with dynamicMig [0]: GPU 0's MIG devices made on demand, GPU 1's
//     static, GPUs 2 and 3 whole.
const (
	h100 = "h100"
	a100 = "a100"
)

// expectedNodes says where each example must fit (and nowhere else).
var expectedNodes = map[string][]string{
	"whole-gpu.yaml":         {a100, h100},
	"mig-1g10gb.yaml":        {a100},
	"mig-on-demand.yaml":     {a100},
	"two-gpus.yaml":          {a100, h100},
	"share-10gi-25pct.yaml":  {h100},
	"extended-resource.yaml": {a100, h100},
}

type report struct{ pass, fail int }

var errChecksFailed = errors.New("checks failed")

func (r *report) check(name string, err error, detail string) {
	if err != nil {
		r.fail++
		fmt.Printf("FAIL %s: %v\n", name, err)
		return
	}
	r.pass++
	fmt.Printf("PASS %s: %s\n", name, detail)
}

func run(nodes nodeFlags, classesPath, examplesDir, writeCases string) error {
	classes, err := loadClasses(classesPath)
	if err != nil {
		return err
	}
	if len(classes) == 0 {
		return fmt.Errorf("%s: no DeviceClass in it", classesPath)
	}
	bySlices := map[string][]*resourceapi.ResourceSlice{}
	var all []*resourceapi.ResourceSlice
	for _, name := range []string{h100, a100} {
		path, ok := nodes[name]
		if !ok {
			return fmt.Errorf("-slices %s=<file> is required", name)
		}
		s, err := loadSlices(path)
		if err != nil {
			return err
		}
		for _, slice := range s {
			if slice.Spec.NodeName == nil || *slice.Spec.NodeName != name {
				return fmt.Errorf("%s: slice %s is not for node %s (run dra slices with --node-name %s)", path, slice.Name, name, name)
			}
		}
		bySlices[name] = s
		all = append(all, s...)
	}
	examples, err := loadExamples(examplesDir, classes)
	if err != nil {
		return err
	}
	fresh := func() *world { return &world{slices: all, classes: classes} }
	r := &report{}

	var shareSpec, onDemandSpec, twoSpec *resourceapi.ResourceClaimSpec
	for _, ex := range examples {
		switch ex.file {
		case "share-10gi-25pct.yaml":
			shareSpec = &ex.claim.Spec
		case "mig-on-demand.yaml":
			onDemandSpec = &ex.claim.Spec
		case "two-gpus.yaml":
			twoSpec = &ex.claim.Spec
		}
		r.check("example/"+ex.file, exampleFits(fresh(), ex), fmt.Sprintf("fits on %s", strings.Join(expectedNodes[ex.file], ", ")))
	}
	for file := range expectedNodes {
		if !slices.ContainsFunc(examples, func(e example) bool { return e.file == file }) {
			r.check("example/"+file, fmt.Errorf("no claim read from %s/%s", examplesDir, file), "")
		}
	}
	if shareSpec == nil || onDemandSpec == nil || twoSpec == nil {
		return fmt.Errorf("%s: the share, on-demand and two-GPU examples are needed", examplesDir)
	}
	checkShares(r, fresh(), shareSpec)
	checkCounters(r, fresh, onDemandSpec)
	checkRefusals(r, fresh(), shareSpec, twoSpec)

	if writeCases != "" {
		n, err := writeCorpus(writeCases, bySlices[h100], classes)
		if err != nil {
			return err
		}
		fmt.Printf("wrote %d cases to %s\n", n, writeCases)
	}
	fmt.Printf("allocator: %d passed, %d failed\n", r.pass, r.fail)
	if r.fail > 0 {
		return fmt.Errorf("%w: %d", errChecksFailed, r.fail)
	}
	return nil
}

// exampleFits: the example's claim fits on exactly the nodes it should, and a share gets
// its share ID and the amounts it asked for.
func exampleFits(w *world, ex example) error {
	want, ok := expectedNodes[ex.file]
	if !ok {
		return fmt.Errorf("no expected node for %s (add it to expectedNodes)", ex.file)
	}
	var got []string
	for _, node := range []string{a100, h100} {
		res, err := w.allocate(node, ex.claim)
		if err != nil {
			return err
		}
		if res == nil {
			continue
		}
		got = append(got, node)
		if ex.file == "share-10gi-25pct.yaml" {
			d := res.Devices.Results[0]
			if d.ShareID == nil {
				return fmt.Errorf("the share on %s has no shareID", d.Device)
			}
			if err := consumedIs(d, "10Gi", "25"); err != nil {
				return err
			}
		}
	}
	sort.Strings(got)
	if !slices.Equal(got, want) {
		return fmt.Errorf("fits on %v, want %v", got, want)
	}
	return nil
}

func consumedIs(d resourceapi.DeviceRequestAllocationResult, memory, compute string) error {
	m, c := d.ConsumedCapacity["memory"], d.ConsumedCapacity["compute"]
	if m.Cmp(resource.MustParse(memory)) != 0 || c.Cmp(resource.MustParse(compute)) != 0 {
		return fmt.Errorf("%s consumed memory %s compute %s, want %s and %s", d.Device, m.String(), c.String(), memory, compute)
	}
	return nil
}

func withMemory(spec *resourceapi.ResourceClaimSpec, memory string) resourceapi.ResourceClaimSpec {
	s := *spec.DeepCopy()
	s.Devices.Requests[0].Exactly.Capacity.Requests["memory"] = resource.MustParse(memory)
	return s
}

// checkShares: two 10Gi shares land on the one shared GPU; a third larger than what is left
// is refused, one of exactly what is left fits.
func checkShares(r *report, w *world, spec *resourceapi.ResourceClaimSpec) {
	var devices []string
	var shareIDs []string
	for _, name := range []string{"share-a", "share-b"} {
		claim := newClaim(name, *spec.DeepCopy())
		res, err := w.allocate(h100, claim)
		if err != nil || res == nil {
			r.check("capacity/two-10gi-shares-one-gpu", fmt.Errorf("%s refused (%v)", name, err), "")
			return
		}
		w.commit(claim, res)
		d := res.Devices.Results[0]
		devices = append(devices, d.Device)
		if d.ShareID != nil {
			shareIDs = append(shareIDs, string(*d.ShareID))
		}
	}
	var err error
	if devices[0] != devices[1] || len(shareIDs) != 2 || shareIDs[0] == shareIDs[1] {
		err = fmt.Errorf("devices %v, share IDs %v: want one device, two share IDs", devices, shareIDs)
	}
	r.check("capacity/two-10gi-shares-one-gpu", err, fmt.Sprintf("both on %s, share IDs %v", devices[0], shareIDs))

	memory := deviceCapacity(w.slices, h100, devices[0], "memory")
	free := memory.DeepCopy()
	free.Sub(resource.MustParse("20Gi"))
	over := free.DeepCopy()
	over.Add(resource.MustParse("2Mi"))
	res, err := w.allocate(h100, newClaim("share-c-over", withMemory(spec, over.String())))
	if err == nil && res != nil {
		err = fmt.Errorf("%s of %s's %s (20Gi held) given to %v", over.String(), devices[0], memory.String(), devicesOf(res))
	}
	r.check("capacity/third-share-above-free-refused", err, fmt.Sprintf("%s refused with %s of %s free", over.String(), free.String(), memory.String()))
	// What is free is an odd number of MiB when the GPU's memory is (81559Mi on the H100):
	// the request rounds up to the 2Mi step past it. The largest step that fits is taken.
	fits := stepDown(free, deviceStep(w.slices, h100, devices[0], "memory"))
	claim := newClaim("share-c-exact", withMemory(spec, fits.String()))
	res, err = w.allocate(h100, claim)
	if err == nil && res == nil {
		err = fmt.Errorf("%s (all the steps free of %s) refused", fits.String(), devices[0])
	} else if err == nil && res.Devices.Results[0].Device != devices[0] {
		err = fmt.Errorf("went to %s, want %s", res.Devices.Results[0].Device, devices[0])
	}
	r.check("capacity/third-share-of-the-free-steps-fits", err, fmt.Sprintf("%s (%s free, 2Mi steps) fits on %s", fits.String(), free.String(), devices[0]))
}

// deviceStep is the validRange step of a capacity (its min and step are the same here).
func deviceStep(all []*resourceapi.ResourceSlice, node, device, name string) resource.Quantity {
	for _, s := range all {
		for _, d := range s.Spec.Devices {
			if s.Spec.Pool.Name == node && d.Name == device {
				if p := d.Capacity[resourceapi.QualifiedName(name)].RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Step != nil {
					return *p.ValidRange.Step
				}
			}
		}
	}
	return resource.MustParse("1")
}

// stepDown rounds q down to a multiple of step.
func stepDown(q, step resource.Quantity) resource.Quantity {
	n := q.Value() / step.Value()
	return *resource.NewQuantity(n*step.Value(), resource.BinarySI)
}

func deviceCapacity(all []*resourceapi.ResourceSlice, node, device, name string) resource.Quantity {
	for _, s := range all {
		if s.Spec.Pool.Name != node {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				return d.Capacity[resourceapi.QualifiedName(name)].Value
			}
		}
	}
	return resource.Quantity{}
}

// checkCounters: on the partitionable GPU, the seven 1g.10gb placements each go once and an
// eighth is refused; the whole GPU (every counter) is refused while one slice is held.
func checkCounters(r *report, fresh func() *world, spec *resourceapi.ResourceClaimSpec) {
	w := fresh()
	var got []string
	for i := range 7 {
		claim := newClaim(fmt.Sprintf("mig-%d", i), *spec.DeepCopy())
		res, err := w.allocate(a100, claim)
		if err != nil || res == nil {
			r.check("counters/seven-1g10gb-placements", fmt.Errorf("slice %d refused (%v) after %v", i+1, err, got), "")
			return
		}
		w.commit(claim, res)
		got = append(got, devicesOf(res)...)
	}
	var err error
	if len(distinct(got)) != 7 {
		err = fmt.Errorf("placements %v: want 7 distinct", got)
	}
	r.check("counters/seven-1g10gb-placements", err, strings.Join(got, " "))
	res, err := w.allocate(a100, newClaim("mig-8", *spec.DeepCopy()))
	if err == nil && res != nil {
		err = fmt.Errorf("an eighth 1g.10gb given %v", devicesOf(res))
	}
	r.check("counters/eighth-1g10gb-refused", err, "no memory slice left on GPU 0")

	whole := "device.attributes['gpu-slicer.io'].index == 0"
	w = fresh()
	res, err = w.allocate(a100, oneRequest("whole-0", "gpu.gpu-slicer.io", whole, nil))
	if err == nil && (res == nil || res.Devices.Results[0].Device != "gpu-0") {
		err = fmt.Errorf("whole gpu-0 not given on an idle GPU: %v", res)
	}
	r.check("counters/whole-gpu-on-idle-gpu", err, "gpu-0 given whole")
	claim := newClaim("one-slice", *spec.DeepCopy())
	if res, err = w.allocate(a100, claim); err == nil && res != nil {
		w.commit(claim, res)
		res, err = w.allocate(a100, oneRequest("whole-0", "gpu.gpu-slicer.io", whole, nil))
		if err == nil && res != nil {
			err = fmt.Errorf("whole gpu-0 given beside %v", devicesOf(res))
		}
	} else if err == nil {
		err = fmt.Errorf("the first slice was refused")
	}
	r.check("counters/whole-gpu-refused-beside-a-slice", err, "its counters are taken by the slice")
}

func distinct(list []string) map[string]bool {
	out := map[string]bool{}
	for _, s := range list {
		out[s] = true
	}
	return out
}

// checkRefusals: claims larger than anything published fit nowhere.
func checkRefusals(r *report, w *world, share, two *resourceapi.ResourceClaimSpec) {
	big := withMemory(share, "200Gi")
	nine := *two.DeepCopy()
	nine.Devices.Requests[0].Exactly.Count = 9
	for _, c := range []struct {
		name string
		spec resourceapi.ResourceClaimSpec
	}{{"refuse/share-of-200gi", big}, {"refuse/nine-gpus-on-eight", nine}} {
		var err error
		for _, node := range []string{a100, h100} {
			res, e := w.allocate(node, newClaim(c.name, c.spec))
			if e == nil && res != nil {
				e = fmt.Errorf("given %v on %s", devicesOf(res), node)
			}
			if e != nil {
				err = e
			}
		}
		r.check(c.name, err, "refused on every node")
	}
}
