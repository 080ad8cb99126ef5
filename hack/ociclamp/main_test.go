package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSpecFilesFindsWhatTheRuntimeReads(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want []string
	}{
		// How conmon starts a container.
		{[]string{"--root", "/r", "create", "--bundle", "/b", "--pid-file", "/p", "id"}, []string{"/b/config.json"}},
		{[]string{"--root=/r", "run", "-b", "/b", "id"}, []string{"/b/config.json"}},
		{[]string{"create", "--bundle=/b", "id"}, []string{"/b/config.json"}},
		{[]string{"create", "id"}, []string{"./config.json"}},
		{[]string{"--root", "/r", "exec", "--process", "/tmp/p.json", "id"}, []string{"/tmp/p.json"}},
		{[]string{"--root", "/r", "start", "id"}, nil},
		{[]string{"--version"}, nil},
	}
	for _, tt := range tests {
		if got := specFiles(tt.args); !slices.Equal(got, tt.want) {
			t.Errorf("specFiles(%q) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

// all is every capability but CAP_SYS_RESOURCE, as these VMs bound root.
var all = func() map[string]bool {
	m := capSet(1<<41 - 1)
	delete(m, "CAP_SYS_RESOURCE")
	return m
}()

func TestClampRaisesOnlyValuesBelowTheFloor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in  string
		floor     int
		want      int64
		changed   bool
		wantOther bool // "other" survives the rewrite
	}{
		{"infra container's -998 in config.json", `{"ociVersion":"1.0.2","process":{"oomScoreAdj":-998,"args":["/pause"]},"other":1.5}`, 0, 0, true, true},
		{"a value above the floor stays", `{"process":{"oomScoreAdj":1000}}`, 0, 1000, false, false},
		{"the floor is the caller's, not 0", `{"process":{"oomScoreAdj":-998}}`, -500, -500, true, false},
		{"exec's process file", `{"args":["sh"],"oomScoreAdj":-998}`, 0, 0, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, changed, err := clamp([]byte(tt.in), limits{oomScoreAdj: tt.floor, bounding: all, hugetlb: true})
			if err != nil {
				t.Fatal(err)
			}
			if changed != tt.changed {
				t.Fatalf("changed = %v, want %v", changed, tt.changed)
			}
			var doc struct {
				Process *struct {
					OOMScoreAdj int64 `json:"oomScoreAdj"`
				} `json:"process"`
				OOMScoreAdj int64   `json:"oomScoreAdj"`
				Other       float64 `json:"other"`
			}
			if err := json.Unmarshal(out, &doc); err != nil {
				t.Fatal(err)
			}
			got := doc.OOMScoreAdj
			if doc.Process != nil {
				got = doc.Process.OOMScoreAdj
			}
			if got != tt.want {
				t.Errorf("oomScoreAdj = %d, want %d", got, tt.want)
			}
			if tt.wantOther && doc.Other != 1.5 {
				t.Errorf("other = %v, want 1.5 kept", doc.Other)
			}
		})
	}
}

func TestClampFileLeavesAnUnchangedFileAlone(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "config.json")
	in := "{\"process\": {\"oomScoreAdj\": 5}}\n"
	if err := os.WriteFile(p, []byte(in), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := clampFile(p, limits{bounding: all, hugetlb: true}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != in {
		t.Errorf("file rewritten: %q", b)
	}
}

func TestClampDropsCapabilitiesOutsideTheBoundingSet(t *testing.T) {
	t.Parallel()
	// What CRI-O asks for a privileged container: everything it knows.
	in := `{"process":{"capabilities":{"bounding":["CAP_CHOWN","CAP_SYS_RESOURCE","CAP_SYS_ADMIN"],"effective":["CAP_SYS_RESOURCE"],"ambient":[]}}}`
	out, changed, err := clamp([]byte(in), limits{bounding: all})
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	var doc struct {
		Process struct {
			Capabilities map[string][]string `json:"capabilities"`
		} `json:"process"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"bounding": {"CAP_CHOWN", "CAP_SYS_ADMIN"}, "effective": {}, "ambient": {}}
	for set, w := range want {
		if got := doc.Process.Capabilities[set]; !slices.Equal(got, w) {
			t.Errorf("%s = %q, want %q", set, got, w)
		}
	}
	if _, changed, _ := clamp([]byte(`{"process":{"capabilities":{"bounding":["CAP_CHOWN"]}}}`), limits{bounding: all}); changed {
		t.Errorf("a request within the bounding set was rewritten")
	}
}

func TestCapSetReadsTheKernelsMask(t *testing.T) {
	t.Parallel()
	// CapBnd of these VMs' root: 0x000001fffeffffff, no CAP_SYS_RESOURCE (24).
	got := capSet(0x000001fffeffffff)
	if got["CAP_SYS_RESOURCE"] || !got["CAP_SYS_ADMIN"] || !got["CAP_CHECKPOINT_RESTORE"] || len(got) != len(capNames)-1 {
		t.Errorf("capSet = %v", got)
	}
}

func TestClampDropsHugepageLimitsWithoutTheController(t *testing.T) {
	t.Parallel()
	// What CRI-O writes for a kubelet's container.
	in := `{"process":{},"linux":{"resources":{"hugepageLimits":[{"pageSize":"2MB","limit":0}],"memory":{"limit":1000}}}}`
	out, changed, err := clamp([]byte(in), limits{bounding: all})
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	var doc struct {
		Linux struct {
			Resources map[string]json.RawMessage `json:"resources"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if _, ok := doc.Linux.Resources["hugepageLimits"]; ok || doc.Linux.Resources["memory"] == nil {
		t.Errorf("resources = %s, want the memory limit alone", out)
	}
	if _, changed, _ := clamp([]byte(in), limits{bounding: all, hugetlb: true}); changed {
		t.Errorf("hugepage limits dropped although the controller is there")
	}
}

func TestHugetlbMountedReadsMountinfo(t *testing.T) {
	t.Parallel()
	// These VMs: cgroup v1 without a hugetlb hierarchy, and the hybrid
	// cgroup2 mount (which lists hugetlb, the one controller no v1
	// hierarchy holds, and where runc sets no limit).
	without := "30 25 0:26 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,memory\n" +
		"31 25 0:27 / /sys/fs/cgroup/pids rw,nosuid shared:10 - cgroup cgroup rw,pids\n" +
		"41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
	with := without + "32 25 0:28 / /sys/fs/cgroup/hugetlb rw,nosuid shared:11 - cgroup cgroup rw,hugetlb\n"
	if hugetlbMounted(without) || !hugetlbMounted(with) {
		t.Errorf("hugetlbMounted: without %v, with %v", hugetlbMounted(without), hugetlbMounted(with))
	}
	// And on this machine, whatever it is, the answer matches /proc/cgroups:
	// on these VMs hugetlb is in no v1 hierarchy.
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Skip(err)
	}
	if cg, err := os.ReadFile("/proc/cgroups"); err == nil && strings.Contains(string(mi), "/sys/fs/cgroup/unified") {
		for _, line := range strings.Split(string(cg), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "hugetlb" && f[1] == "0" && hugetlbMounted(string(mi)) {
				t.Errorf("hybrid host, hugetlb in no v1 hierarchy, yet hugetlbMounted says it is mounted")
			}
		}
	}
}
