package bench

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
)

// MachineInfo describes the host a suite ran on.
type MachineInfo struct {
	NProc      int    `json:"nproc"`
	CPUModel   string `json:"cpu_model"`
	MemTotal   string `json:"mem_total"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	GoCommand  string `json:"go_command,omitempty"`
	Nginx      string `json:"nginx"`
	HAProxy    string `json:"haproxy"`
	Wrk        string `json:"wrk,omitempty"`
	NoFileHard string `json:"nofile_hard,omitempty"`
	// LoadAvg is /proc/loadavg when the suite started (and ended): the
	// machine may be shared, which moves latencies more than anything else.
	LoadAvg    string `json:"loadavg,omitempty"`
	LoadAvgEnd string `json:"loadavg_end,omitempty"`
}

// LoadAvg returns the first three fields of /proc/loadavg.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) > 3 {
		f = f[:3]
	}
	return strings.Join(f, " ")
}

// CollectMachineInfo reads /proc and asks the tools for their versions.
func CollectMachineInfo() MachineInfo {
	m := MachineInfo{NProc: runtime.NumCPU(), GoVersion: runtime.Version(), LoadAvg: LoadAvg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				m.MemTotal = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.GoCommand = toolVersion("go", "version")
	m.Nginx = toolVersion("nginx", "-v")
	m.HAProxy = toolVersion("haproxy", "-v")
	m.Wrk = toolVersion("wrk", "--version")
	if b, err := os.ReadFile("/proc/self/limits"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "Max open files") {
				if f := strings.Fields(l); len(f) >= 5 {
					m.NoFileHard = f[4]
				}
			}
		}
	}
	return m
}

// toolVersion returns the first line a tool prints for its version flag, or
// "not installed".
func toolVersion(bin string, args ...string) string {
	path, err := exec.LookPath(bin)
	if err != nil {
		return "not installed"
	}
	out, _ := exec.Command(path, args...).CombinedOutput()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(line)
}

// MachineMarkdown renders machine.md.
func MachineMarkdown(m MachineInfo) string {
	var b strings.Builder
	b.WriteString("# Machine\n\n| what | value |\n|---|---|\n")
	row := func(k, v string) { fmt.Fprintf(&b, "| %s | %s |\n", k, strings.ReplaceAll(v, "|", "\\|")) }
	row("nproc", fmt.Sprint(m.NProc))
	row("CPU model", m.CPUModel)
	row("memory", m.MemTotal)
	row("kernel", m.Kernel)
	row("Go (harness build)", m.GoVersion)
	row("go command", m.GoCommand)
	row("nginx", m.Nginx)
	row("haproxy", m.HAProxy)
	row("wrk", m.Wrk)
	row("open files (hard limit)", m.NoFileHard)
	row("load average at start (1/5/15 min)", m.LoadAvg)
	row("load average at end", m.LoadAvgEnd)
	return b.String()
}
