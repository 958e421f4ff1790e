-- A draw's winner whose hold could not be made when the result was carried
-- to Redis (the units the draw counted were not all there) is never dropped
-- silently: unheld records why (the policy's refusal: OUT_OF_STOCK,
-- QUOTA_EXCEEDED, ...), and the winner waits first in the SKU's waitlist
-- instead. NULL for every winner who got its hold, and for every loser.
ALTER TABLE draw_results ADD COLUMN unheld text;
