set terminal pngcairo size 900,560 font 'sans,10'
set grid
set key top right
set xlabel 'job tokens'
set output 'bench/results/2026-12-03/loss_tokens_conv_2x2.png'
set ylabel 'training loss (mean of replicas, last 5 steps)'
set title 'training loss (mean of replicas, last 5 steps) vs tokens, layout 2x2'
set yrange [*:3.0]
plot 'bench/results/2026-12-03/data/conv_2x2_ddp.train.dat' using 1:2 with lines lw 1.5 title 'ddp', 'bench/results/2026-12-03/data/conv_2x2_localsgd.train.dat' using 1:2 with lines lw 1.5 title 'localsgd', 'bench/results/2026-12-03/data/conv_2x2_diloco.train.dat' using 1:2 with lines lw 1.5 title 'diloco', 'bench/results/2026-12-03/data/conv_2x2_edit.train.dat' using 1:2 with lines lw 1.5 title 'edit', 'bench/results/2026-12-03/data/conv_2x2_a-edit.train.dat' using 1:2 with lines lw 1.5 title 'a-edit', 'bench/results/2026-12-03/data/conv_2x2_edit+median.train.dat' using 1:2 with lines lw 1.5 title 'edit+median'
set output 'bench/results/2026-12-03/val_tokens_conv_2x2.png'
set ylabel 'validation loss'
set title 'validation loss vs tokens, layout 2x2'
set yrange [*:*]
plot 'bench/results/2026-12-03/data/conv_2x2_ddp.val.dat' using 1:2 with linespoints lw 1.5 title 'ddp', 'bench/results/2026-12-03/data/conv_2x2_localsgd.val.dat' using 1:2 with linespoints lw 1.5 title 'localsgd', 'bench/results/2026-12-03/data/conv_2x2_diloco.val.dat' using 1:2 with linespoints lw 1.5 title 'diloco', 'bench/results/2026-12-03/data/conv_2x2_edit.val.dat' using 1:2 with linespoints lw 1.5 title 'edit', 'bench/results/2026-12-03/data/conv_2x2_a-edit.val.dat' using 1:2 with linespoints lw 1.5 title 'a-edit', 'bench/results/2026-12-03/data/conv_2x2_edit+median.val.dat' using 1:2 with linespoints lw 1.5 title 'edit+median'
