// Time on the page: a clock that ticks, and how times are written.
import { useEffect, useState } from 'react';

// useNow returns Date.now(), updated every `every` milliseconds.
export function useNow(every) {
  const [now, setNow] = useState(Date.now);
  useEffect(() => {
    const id = setInterval(() => setNow(Date.now()), every);
    return () => clearInterval(id);
  }, [every]);
  return now;
}

// formatClock writes a time of day, HH:MM:SS.
export function formatClock(t) {
  return new Date(t).toLocaleTimeString('en-GB', { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

// formatLeft writes a duration as M:SS (H:MM:SS from an hour on); a time
// already past is 0:00.
export function formatLeft(ms) {
  const s = Math.max(0, Math.ceil(ms / 1000));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, '0');
  return h > 0 ? `${h}:${String(m).padStart(2, '0')}:${ss}` : `${m}:${ss}`;
}
