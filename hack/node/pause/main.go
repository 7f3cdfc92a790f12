// pause holds a pod's namespaces open: it sleeps until SIGINT or SIGTERM and then exits 0. It is the
// sandbox image of the real node (make images), built here because no registry is reachable.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	<-stop
}
