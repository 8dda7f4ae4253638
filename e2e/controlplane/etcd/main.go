// etcd for the e2e control plane: the upstream server's own entry point,
// built from the Go module proxy (see ../build.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
