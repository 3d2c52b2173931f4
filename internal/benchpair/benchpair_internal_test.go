package benchpair

import "testing"

func TestRoundRange(t *testing.T) {
	for _, c := range []struct {
		name      string
		rounds    [][2]float64
		low, high float64
	}{
		{"one round", [][2]float64{{90, 100}}, 0.9, 0.9},
		{"spread", [][2]float64{{80, 100}, {120, 100}, {100, 100}}, 0.8, 1.2},
		{"lowest last", [][2]float64{{100, 100}, {50, 100}}, 0.5, 1},
		{"no baseline rate in a round", [][2]float64{{10, 0}, {90, 100}}, 0.9, 0.9},
		{"none", nil, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			low, high := roundRange(c.rounds)
			if low != c.low || high != c.high {
				t.Errorf("roundRange(%v) = %v, %v; want %v, %v", c.rounds, low, high, c.low, c.high)
			}
		})
	}
}
