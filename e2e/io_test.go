package e2e

import (
	"io"
	"net/http"
	"strings"
)

func ioCopy(b *strings.Builder, resp *http.Response) (int64, error) { return io.Copy(b, resp.Body) }
