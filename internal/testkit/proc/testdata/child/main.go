// Command child is the process the proc package's tests start: it says what
// happens to it on stdout, so the tests can assert through the harness.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	listen := flag.String("listen", "", "serve 200 on this address")
	ignoreTerm := flag.Bool("ignore-term", false, "survive SIGTERM")
	exit := flag.Int("exit", -1, "print to both streams and exit with this code")
	flag.Parse()
	if *exit >= 0 {
		fmt.Println("to stdout")
		fmt.Fprintln(os.Stderr, "to stderr")
		os.Exit(*exit)
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGHUP, syscall.SIGTERM)
	if *listen != "" {
		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		go func() { _ = http.Serve(ln, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})) }()
	}
	fmt.Println("started")
	for s := range sigs {
		fmt.Println("got", s)
		if s == syscall.SIGTERM && !*ignoreTerm {
			os.Exit(0)
		}
	}
}
