package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"krane.dev/ctrl/auth"
	clusterv1 "krane.dev/proto/krane/cluster/v1"
	"krane.dev/shared/kinds"
)

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return false }

// WatchBootstrap streams a bootstrap of 100,000 deployments of one region
// from ctrl (MySQL -> gRPC) and counts rows per second (median of 3).
func WatchBootstrap(ctx context.Context, e *Env) ([]Figure, error) {
	n := e.size(100000, 500)
	region := "bench-watch"
	if err := (bulk{e.Store.DB()}).deployments(ctx, region, "ws-bench-watch", "bw", n, 1); err != nil {
		return nil, err
	}
	token, err := auth.RegisterCluster(ctx, e.Store, region, region+"-1")
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(e.St.CtrlAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithPerRPCCredentials(bearer(token)), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := clusterv1.NewClusterServiceClient(conn)
	var rates []float64
	for rep := range e.reps() {
		begin := time.Now()
		st, err := client.Watch(ctx, &clusterv1.WatchRequest{Kind: kinds.Deployment})
		if err != nil {
			return nil, err
		}
		got := 0
		for {
			ev, err := st.Recv()
			if errors.Is(err, io.EOF) || err != nil {
				return nil, fmt.Errorf("watch ended after %d rows: %w", got, err)
			}
			if ev.GetChange() != nil {
				got++
			}
			if ev.GetBootstrapComplete() != nil {
				break
			}
		}
		took := time.Since(begin)
		if got != n {
			return nil, fmt.Errorf("bootstrap sent %d rows, want %d", got, n)
		}
		rates = append(rates, float64(n)/took.Seconds())
		e.logf("watch bootstrap: run %d: %d rows in %s", rep+1, n, took.Round(time.Millisecond))
	}
	return []Figure{{Key: "rows", Name: fmt.Sprintf("bootstrap of %s deployments, MySQL -> gRPC stream", Format(float64(n))), Value: median(rates), Unit: "rows/s"}}, nil
}
