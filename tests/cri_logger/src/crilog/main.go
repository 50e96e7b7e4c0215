// crilog OUT MAXLEN COMMAND [ARG...]: runs COMMAND with its stdout and stderr
// written to OUT by containerd's own CRI logger (logger.go, containerd v1.6.20
// pkg/cri/io), wired as containerd's CRI plugin wires a container's
// (pkg/cri/server/container_start.go: one file, a serial writer, one logger
// per stream, MAXLEN its max_container_log_line_size).

package main

import (
	"os"
	"os/exec"
	"strconv"

	cioutil "github.com/containerd/containerd/pkg/ioutil"

	cio "crilog/io"
)

func main() {
	f, err := os.OpenFile(os.Args[1], os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0640)
	if err != nil {
		panic(err)
	}
	maxLen, err := strconv.Atoi(os.Args[2])
	if err != nil {
		panic(err)
	}
	wc := cioutil.NewSerialWriteCloser(f)
	stdout, stdoutCh := cio.NewCRILogger(os.Args[1], wc, cio.Stdout, maxLen)
	stderr, stderrCh := cio.NewCRILogger(os.Args[1], wc, cio.Stderr, maxLen)
	cmd := exec.Command(os.Args[3], os.Args[4:]...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	runErr := cmd.Run()
	stdout.Close()
	stderr.Close()
	<-stdoutCh
	<-stderrCh
	wc.Close()
	if runErr != nil {
		panic(runErr)
	}
}
