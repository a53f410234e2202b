package cli

import (
	"context"
	"time"
)

// flushTraces sends the spans still buffered when ctrl serve ends.
func flushTraces(flush func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = flush(ctx)
}
