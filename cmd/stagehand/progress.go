package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// showProgress reports whether progress may be drawn: standard output is a terminal and the output is not JSON.
func (a *app) showProgress() bool {
	return !a.json && a.opts.isTerminal(a.stdout)
}

// bar is a progress bar with a rate-based ETA ([elapsed:remaining]); every method is a no-op on a nil bar, which
// is what newBar returns when no progress may be drawn. It starts no goroutine: the caller drives it.
type bar struct {
	pb *progressbar.ProgressBar
	w  io.Writer
}

func (a *app) newBar(total int64, description string) *bar {
	if !a.showProgress() {
		return nil
	}
	return &bar{w: a.stdout, pb: progressbar.NewOptions64(max(total, 1),
		progressbar.OptionSetWriter(a.stdout),
		progressbar.OptionSetDescription(description),
		progressbar.OptionSetWidth(30),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
	)}
}

// set moves the bar to done of total (total may change while the work runs, as a log head does).
func (b *bar) set(done, total int64) {
	if b == nil {
		return
	}
	total = max(total, 1)
	if int64(b.pb.GetMax64()) != total {
		b.pb.ChangeMax64(total)
	}
	_ = b.pb.Set64(min(max(done, 0), total-1)) // the bar completes only through finish
}

func (b *bar) describe(description string) {
	if b != nil {
		b.pb.Describe(description)
	}
}

// finish fills the bar and ends its line.
func (b *bar) finish() {
	if b == nil {
		return
	}
	_ = b.pb.Finish()
	fmt.Fprintln(b.w)
}

// abort leaves the bar where it is and ends its line.
func (b *bar) abort() {
	if b == nil {
		return
	}
	_ = b.pb.Exit()
	fmt.Fprintln(b.w)
}

// spinner shows that work of unknown length is running, with the elapsed time. A nil spinner (no progress may be
// drawn) does nothing. Its one goroutine ends in stop.
type spinner struct {
	pb   *progressbar.ProgressBar
	quit chan struct{}
	wg   sync.WaitGroup
}

func (a *app) newSpinner(description string) *spinner {
	if !a.showProgress() {
		return nil
	}
	s := &spinner{
		pb: progressbar.NewOptions64(-1,
			progressbar.OptionSetWriter(a.stdout),
			progressbar.OptionSetDescription(description),
			progressbar.OptionSpinnerType(14),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionSetSpinnerChangeInterval(0), // the library's own ticker goroutine stays off
		),
		quit: make(chan struct{}),
	}
	_ = s.pb.RenderBlank()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.quit:
				return
			case <-t.C:
				_ = s.pb.RenderBlank()
			}
		}
	}()
	return s
}

// stop ends the spinner and erases it.
func (s *spinner) stop() {
	if s == nil {
		return
	}
	close(s.quit)
	s.wg.Wait()
	_ = s.pb.Clear()
}
