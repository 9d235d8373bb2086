// Command libcni-driver runs a network configuration list through libcni,
// the library containerd's CRI, CRI-O and cnitool call plugins with, so the
// runtime tests exercise ipam-delegated exactly as those runtimes do.
//
// Usage: libcni-driver add|check|del CONFLIST CONTAINER_ID NETNS IFNAME
//
// Plugins are looked up in CNI_PATH (colon-separated); libcni keeps its
// cache of results in CNI_CACHE_DIR, which must be set (libcni would fall
// back to the machine's /var/lib/cni). LIBCNI_ARGS ("K1=V1;K2=V2") sets the
// runtime's CNI_ARGS, as containerd's CRI sets K8S_POD_NAMESPACE and the
// rest; LIBCNI_IPS (comma-separated) the "ips" capability, as a pod's
// static address reaches runtimeConfig. ADD prints the result as JSON. A
// failure prints libcni's error on stderr, and for a CNI error object also
// a line "cni-error code=N msg=...", then exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		var cniErr *types.Error
		if errors.As(err, &cniErr) {
			fmt.Fprintf(os.Stderr, "cni-error code=%d msg=%s\n", cniErr.Code, cniErr.Msg)
		}
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("usage: libcni-driver add|check|del CONFLIST CONTAINER_ID NETNS IFNAME")
	}
	command, file, id, netns, ifname := args[0], args[1], args[2], args[3], args[4]
	list, err := libcni.ConfListFromFile(file)
	if err != nil {
		return err
	}
	cacheDir := os.Getenv("CNI_CACHE_DIR")
	if cacheDir == "" {
		return fmt.Errorf("CNI_CACHE_DIR must be set")
	}
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	cni := libcni.NewCNIConfigWithCacheDir(paths, cacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: netns, IfName: ifname}
	for _, pair := range strings.Split(os.Getenv("LIBCNI_ARGS"), ";") {
		if key, value, found := strings.Cut(pair, "="); found {
			rt.Args = append(rt.Args, [2]string{key, value})
		}
	}
	if ips := os.Getenv("LIBCNI_IPS"); ips != "" {
		rt.CapabilityArgs = map[string]interface{}{"ips": strings.Split(ips, ",")}
	}
	ctx := context.Background()

	switch command {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(result)
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	}
	return fmt.Errorf("unknown command %q", command)
}
