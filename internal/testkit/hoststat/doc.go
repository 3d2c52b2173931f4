// Package hoststat reads what the host did to this machine's CPUs while a benchmark measured: the time the
// hypervisor ran something else on them (steal), from Linux's /proc/stat. On a virtual machine whose host is busy,
// steal takes a share of every core that neither side of a comparison controls, and a figure measured then is not
// comparable with one measured on a quiet host; the benchmarks print it beside their figures. It also reads the
// machine's busy CPU time and this process's own, so a benchmark can say what an operation costs in CPU: on a
// machine that a comparison saturates, the ratio of the rates follows the inverse ratio of those costs.
package hoststat
