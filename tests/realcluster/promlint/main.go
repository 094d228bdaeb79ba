// Command promlint lints the Prometheus text exposition on its standard input with client_golang's promlint, the
// linter `promtool check metrics` runs: each problem on standard error as "<metric> <problem>", exit 3 when there
// is one, 1 when the input cannot be read. Built alone (tests/realcluster/build.sh) because building promtool
// compiles all of Prometheus and the cloud SDKs of its service discovery for this one check.
package main

import (
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
)

func main() {
	problems, err := promlint.New(os.Stdin).Lint()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error while linting:", err)
		os.Exit(1)
	}
	for _, p := range problems {
		fmt.Fprintln(os.Stderr, p.Metric, p.Text)
	}
	if len(problems) > 0 {
		os.Exit(3)
	}
}
